"""accy's benchmark harness: six workloads side by side with JAX and PyTorch.

Run it with `python -m bench` (see `bench/README.md`). The workloads live in
`bench.workloads` (accy side, inputs, sizes); each system's version and its runner in
`bench.systems`; measurement in `bench.measure`; result checks in `bench.compare`.
"""
