"""Neural networks: functional building blocks, initialisers and layers as tree modules.

- `accy.nn.functional` (re-exported here): softmax, cross-entropy, layer norm, GELU, fused
  attention, dropout, pooling, mixed precision: compositions of the closed set of kinds, on
  traced values and named arrays alike.
- `accy.nn.Module` (`module.py`): frozen dataclasses registered as trees, with static
  hyper-parameter fields (`accy.nn.field(static=True)`), and `partition`/`combine`.
- `accy.nn.init`: initialisers by named fan-in/fan-out, drawn from `accy.random` keys.
- the layers (`layers.py`): `Linear`, `Embedding`, `LayerNorm`, `RMSNorm`, `Dropout`, `Conv`,
  `MultiHeadAttention`, `MLP`, `SwiGLU`, `Stacked`.

>>> import accy, numpy as np
>>> x = accy.named(np.array([0.0, 0.0], np.float32), ("vocab",), device="reference")
>>> accy.nn.softmax(x, "vocab").array.tolist()
[0.5, 0.5]
"""

from . import fp8, functional, init
from .fp8 import Fp8Policy, fp8_matmul
from .functional import *  # noqa: F403
from .functional import __all__ as _functional
from .layers import (
    MLP,
    Conv,
    Dropout,
    Embedding,
    LayerNorm,
    Linear,
    MultiHeadAttention,
    RMSNorm,
    Stacked,
    SwiGLU,
    decay_mask,
    rotary,
)
from .module import (
    Module,
    combine,
    decayed,
    field,
    is_array,
    is_float_array,
    is_matrix,
    parameter_count,
    partition,
)

__all__ = [
    *_functional,
    "MLP",
    "Conv",
    "Dropout",
    "Embedding",
    "Fp8Policy",
    "LayerNorm",
    "Linear",
    "Module",
    "MultiHeadAttention",
    "RMSNorm",
    "Stacked",
    "SwiGLU",
    "combine",
    "fp8_matmul",
    "decay_mask",
    "decayed",
    "field",
    "fp8",
    "functional",
    "init",
    "is_array",
    "is_float_array",
    "is_matrix",
    "parameter_count",
    "partition",
    "rotary",
]
