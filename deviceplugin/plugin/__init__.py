"""The device-plugin daemon (`serve`): a composition over the node engine that runs a
kubelet v1beta1 server per resource; also `inspect` and `cdi-spec`'s spec (`demo` is in
`demos`).

May import `model`, `node`, `kubelet`, `ops`, `runtime`, `sim` and `plugin`: never the DRA
driver, `explain` or the root.
"""
