"""Generated gRPC stubs; regenerate with `make protos`."""
