"""Small C kernels the engine compiles for this host on first use (see build.py)."""
