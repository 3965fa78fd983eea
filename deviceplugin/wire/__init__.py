"""The generated gRPC stubs of the kubelet APIs this package speaks or emulates, one package per
API and version as the kubelet names them (`deviceplugin/v1beta1`, `podresources/v1`, `dra/v1`,
`dra/v1beta1`, `pluginregistration/v1`, `drahealth/v1`, `drahealth/v1alpha1`); regenerate with
`make protos`. Kept apart from the code that serves or calls them so that the daemons, the
front-ends and the emulators in `sim` share one copy without importing each other.

May import nothing of the package but `wire`; every layer may import it.
"""
