"""What the benchmarks (`bench/`) and the end-to-end tests (`e2e/`) both run: a child process
watched from /proc (`process`) and the two device plugins, NVIDIA's reference and ours, as
processes on one simulated driver root (`plugins`). Owned by neither, so that neither imports
the other.
"""
