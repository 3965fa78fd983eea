"""Generated gRPC stubs of the kubelet DRA resource-health API; regenerate with `make protos`."""
