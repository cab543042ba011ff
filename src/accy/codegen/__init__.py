"""Code generation shared by every backend: the C dialect (`c/`) and the disk cache of built
libraries (`cache.py`)."""
