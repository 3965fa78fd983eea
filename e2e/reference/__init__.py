"""NVIDIA's own components built unmodified (`build.sh`), and comparisons of ours with them."""
