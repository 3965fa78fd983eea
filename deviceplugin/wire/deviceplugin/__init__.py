"""Generated gRPC stubs of the kubelet device-plugin API; regenerate with `make protos`."""
