"""The fragment API, the names of accy's first execution interface, kept as a thin layer over
the backend protocol (`accy.backends.base`) with no logic of its own:

- `accy.compat.lower`: `compile_fragment(handle, program, options)` makes an artifact;
- `accy.compat.executable`: `load_fragment(handle, artifact)` loads it; `invoke` and
  `prepare_invocation` run it on raw buffers;
- `accy.compat.execute`: `run_cpu(program, inputs, outputs)`, `Cpu(program).launch(...)`;
- `accy.compat.gpu`: device states whose `handle()` names a device (`gpu.cpu.State()`,
  `gpu.cuda.State.init_device(0)`).

Nothing else in accy imports this package; `accy.compile` and `Executable.run_buffers` are the
interface it maps onto.

>>> import accy.compat
>>> accy.compat.execute.Cpu.__name__
'Cpu'
"""

from . import executable, execute, gpu, lower

__all__ = ["executable", "execute", "gpu", "lower"]
