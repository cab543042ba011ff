"""Code generation shared by every backend."""
