"""The seed's names for compiling and running programs, kept for compatibility as a thin layer
over the backend protocol (`accy.backends.base`): `seed` holds them all; the modules
`accy.execute`, `accy.executable` and `accy.gpu` re-export them under their old names."""

from . import seed

__all__ = ["seed"]
