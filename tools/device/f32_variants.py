"""Session-5 diagnosis: the f32 GPT-2 step takes ~300 ms a call in bench.gpt2 while its actions
timed one by one sum to ~187 ms. Times the jitted step (as bench.gpt2 runs it) with one switch
changed: `default`, `nobatch` (no batched launches), `noremat`, `nodonate`.

    PYTHONPATH=src python3 tools/device/f32_variants.py default
"""

import dataclasses
import sys
import time

import numpy as np

sys.path.insert(0, ".")
import accy.backends.cuda.compile as cuda_compile  # noqa: E402
import accy.demo.gpt2 as demo  # noqa: E402
from bench.gpt2 import SCALES, _host, accy_inputs  # noqa: E402

variant = sys.argv[1]
dtype = sys.argv[2] if len(sys.argv) > 2 else "f32"
if variant == "nobatch":
    cuda_compile.batch_launches = lambda *args, **kwargs: None
if variant == "noremat":
    cuda_compile.GPU = dataclasses.replace(cuda_compile.GPU, rematerialize_after=0)
if variant == "nodonate":
    demo.DONATING_DEVICES = ()
s = SCALES["cuda"]
step = demo.training_step(s, "cuda", dtype, False)
params, state, ids, targets = accy_inputs(s, "cuda", dtype=dtype)
loss, params, state = step(params, state, ids, targets)
float(np.asarray(_host(loss.array)))
times = []
for _ in range(4):
    t0 = time.perf_counter()
    loss, params, state = step(params, state, ids, targets)
    float(np.asarray(_host(loss.array)))
    times.append(time.perf_counter() - t0)
each = [round(t * 1e3) for t in times]
print(f"{dtype} {variant:9s} step {np.median(times) * 1e3:7.1f} ms ({each})")
