"""grad.zig's programs, written as grad.zig writes them: shared by the core
tests (which evaluate them) and the autodiff tests (which differentiate them)."""

from __future__ import annotations

import accy

f32 = accy.f32


def elementwise_loss(builder, args):
    product = args[0].mul(args[1])
    return product.sum("lane")


def embedding_lookup_loss(builder, args):
    gathered = args[0].gather(args[1], "vocab")
    return gathered.sum(("token", "channel"))


def relu_loss(builder, args):
    zero = builder.scalar(f32, 0.0)
    rectified = args[0].max(zero)
    return rectified.sum("lane")


def cube_loss(builder, args):
    three = builder.scalar(f32, 3.0)
    cubed = args[0].pow(three)
    return cubed.sum("lane")


def max_loss(builder, args):
    init = builder.scalar(f32, -3.4e38)
    return args[0].reduce(init, "max", "lane")


def max_loss_with_init_param(builder, args):
    return args[0].reduce(args[1], "max", "lane")


def abs_loss(builder, args):
    return args[0].abs().sum("lane")


def tan_loss(builder, args):
    return args[0].tan().sum("lane")


def batched_dot_general_loss(builder, args):
    product = args[0].contract(args[1], "k")
    weighted = product.mul(args[2])
    return weighted.sum(("b", "m", "n"))


def transposed_projection_loss(builder, args):
    product = args[0].builder.dot_general(args[0], args[1], [0], [0], [], [])
    return product.sum(("m", "n"))


def causal_attention_loss(builder, args):
    queries, keys, values, mask = args
    scores = queries.contract(keys.rename("token", "key"), "channel")
    masked = scores.add(mask)
    centered = masked.sub(masked.max("key"))
    weights = centered.exp()
    probs = weights.div(weights.sum("key"))
    mixed = probs.contract(values.rename("token", "key"), "key")
    squared = mixed.mul(mixed)
    return squared.sum(("token", "channel"))


CUSTOM_DOUBLE = "accy.custom.double"


def double_sum_loss(builder, args):
    doubled = builder.custom_call(CUSTOM_DOUBLE, 1, [args[0]], args[0].ty)
    return doubled.sum("lane")


def plain_sum_loss(builder, args):
    return args[0].sum("lane")
