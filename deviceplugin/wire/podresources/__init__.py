"""Generated gRPC stubs of the kubelet PodResources API; regenerate with `make protos`."""
