"""Generated gRPC stubs of the kubelet DRA plugin API; regenerate with `make protos`."""
