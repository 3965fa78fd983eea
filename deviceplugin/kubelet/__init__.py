"""The device-plugin front-end: the kubelet's v1beta1 API.

One gRPC server per resource name, registration on `kubelet.sock` (and again after a kubelet
restart), the responder that turns model answers into Allocate and GetPreferredAllocation
replies, and the PodResources client; the APIs' generated stubs are in `wire`.

May import: `deviceplugin.wire`, `deviceplugin.model` and `deviceplugin.node`. Never another
front-end or the root.
"""
