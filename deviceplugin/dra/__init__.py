"""The DRA driver (`dra serve`; `dra demo` is in `demos`): this node's GPUs for the scheduler
(ResourceSlices) and for the kubelet (the DRA plugin's gRPC services), a composition over the
node engine the device plugin runs on too (`service`). `dra explain` and its API and scheduler
emulation live apart, in `explain/`.

May import `wire`, `model`, `node`, `ops`, `runtime`, `sim` and `dra`: never the device plugin
(`plugin`), `explain` or the root.
"""
