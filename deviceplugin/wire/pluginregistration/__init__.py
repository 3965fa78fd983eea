"""Generated gRPC stubs of the kubelet plugin-registration API; regenerate with `make protos`."""
