"""The C dialect shared by the CPU backend, the CUDA backend and the kernel DSL."""
