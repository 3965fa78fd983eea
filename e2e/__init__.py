"""End-to-end tests with a real container runtime (podman): `make e2e`, as root."""
