"""Programs the attention tests share."""

from __future__ import annotations

import numpy as np

import accy
from accy.attention import composition
from accy.attention.records import records_for
from accy.attention.signature import Signature, check


def output_and_lse_loss(s: Signature, specs: list) -> accy.Program:
    """value_and_grad (wrt q, k and v) of a weighted sum of the forward record's output and
    logsumexp (hi + lo in 16 bits), which sends a nonzero cotangent of the logsumexp to the
    backward record."""

    def body(b, args):
        packed = records_for(s).register().forward.call(b, *args)
        out, lse = composition.unpack(b, s, check(s, *specs), packed)
        total = 0
        for x in (out, lse):
            w = np.linspace(-1, 1, x.ty.size).reshape(x.ty.extents)
            total = total + (x * b.constant(w, x.ty)).sum(tuple(x.ty.axes))
        return total

    return accy.value_and_grad(accy.trace.define("lse", specs, body), wrt=(0, 1, 2))
