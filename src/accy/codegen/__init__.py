"""Code generation shared by every backend: the disk cache of built libraries (the C dialect
will live here too)."""
