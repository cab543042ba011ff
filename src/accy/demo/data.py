"""The learning task: sort a sequence of digits.

A sample is `d1 .. dn SEP s1 .. sn` where s is d sorted. The model reads it left to right and
is trained to predict each next token; only the predictions of s1 .. sn count (the digits
before SEP are random, so they cannot be predicted).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DIGITS = 10
SEPARATOR = DIGITS
VOCAB = DIGITS + 1


@dataclass(frozen=True)
class SortingTask:
    length: int = 10

    @property
    def tokens(self) -> int:
        """Positions the model sees: the whole sample but its last token."""
        return 2 * self.length

    def batch(self, rng: np.random.Generator, size: int):
        """(inputs, targets, weights): int32 inputs and targets {batch, token}, float32
        weights that are 1 on the positions whose prediction is scored."""
        digits = rng.integers(0, DIGITS, (size, self.length))
        separator = np.full((size, 1), SEPARATOR)
        sample = np.concatenate([digits, separator, np.sort(digits, axis=1)], axis=1)
        weights = np.zeros((size, self.tokens), np.float32)
        weights[:, self.length :] = 1.0
        return sample[:, :-1].astype(np.int32), sample[:, 1:].astype(np.int32), weights
