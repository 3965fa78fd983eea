"""The operations front-end: what the plugin tells the people who run it.

`/healthz`, `/readyz`, `/metrics` and `/status` over HTTP, the Prometheus instruments, the
readiness rule, the snapshot behind `/status` and `inspect`, and the log formats.

May import: `deviceplugin.model` and `deviceplugin.node`. Never another front-end or the root:
the root hands it what it shows (a view of the supervisor, a pod-assignment reader).
"""
