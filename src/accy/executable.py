"""Loaded artifacts and their invocation over raw buffers (kept for compatibility; see
`accy.compat.seed`): `load_fragment`, `invoke`, `prepare_invocation`."""

from .compat.seed import Bindings, Fragment, invoke, load_fragment, prepare_invocation

__all__ = ["Bindings", "Fragment", "invoke", "load_fragment", "prepare_invocation"]
