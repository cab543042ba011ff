"""accy's settings: one typed object, the only place that reads the process environment.

Each setting has a name, a type, a default and an `ACCY_*` variable that sets it; the variable is
read once, the first time the setting is asked for. `accy.config.update(name, value)` changes a
setting for the rest of the process and `accy.config.override(name=value)` for a `with` block.
Settings that change the code accy generates say so (`changes_generated_code`): every compile
cache key includes `config.code_key()`, so changing one never reuses code built under another.

Variables accy reads but does not own (`CC`, `CUDA_HOME`, a launcher's `RANK`) are read here too,
through `config.environment(name)`, so that no other module touches `os.environ`.

>>> import accy
>>> accy.config.debug_nans
False
>>> with accy.config.override(debug_nans=True):
...     accy.config.debug_nans
True
>>> accy.config.debug_nans
False
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from accy.errors import AccyError


class ConfigError(AccyError):
    """A setting's name is unknown, or its value (given or read from its variable) is invalid."""


def _boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("must be one of 1/0, true/false, yes/no, on/off")


def _whole_number(text: str) -> int:
    value = int(text.strip())
    if value < 0:
        raise ValueError("must be a whole number of at least 0")
    return value


@dataclass(frozen=True)
class Setting:
    """One setting: its name, the variable that sets it, how to read that variable, its default,
    what it means, and whether it changes the code accy generates."""

    name: str
    variable: str
    parse: Callable[[str], Any]
    default: Any
    meaning: str
    changes_generated_code: bool = False

    @property
    def kind(self) -> type:
        return type(self.default)


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "debug_nans",
        "ACCY_DEBUG_NANS",
        _boolean,
        False,
        "Check every jitted call's outputs for NaN and inf; on one, re-run the step operation by "
        "operation and name the first operation (and the user's source line) that made it.",
    ),
)


class Config:
    """The process's settings (one instance: `accy.config`). Read a setting as an attribute."""

    def __init__(self, settings: tuple[Setting, ...] = SETTINGS) -> None:
        self._settings: dict[str, Setting] = {s.name: s for s in settings}
        self._values: dict[str, Any] = {}

    @property
    def settings(self) -> Mapping[str, Setting]:
        """Every setting by name (what docs/config.md lists)."""
        return dict(self._settings)

    def _setting(self, name: str) -> Setting:
        if name not in self._settings:
            known = ", ".join(sorted(self._settings))
            raise ConfigError(f"accy.config has no setting {name!r}; the settings are: {known}")
        return self._settings[name]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        setting = self._setting(name)
        if name not in self._values:
            self._values[name] = self._read(setting)
        # Kept as a plain attribute too, so later reads skip this method: the jit call path
        # reads `debug_nans` on every call.
        self.__dict__[name] = self._values[name]
        return self._values[name]

    def _read(self, setting: Setting) -> Any:
        text = os.environ.get(setting.variable)
        if text is None:
            return setting.default
        try:
            return setting.parse(text)
        except ValueError as error:
            raise ConfigError(
                f"{setting.variable}={text!r} is not a valid value for accy.config."
                f"{setting.name}: {error}"
            ) from None

    def _checked(self, setting: Setting, value: Any) -> Any:
        kind = setting.kind
        valid = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not valid:
            raise ConfigError(
                f"accy.config.{setting.name} takes a {kind.__name__}, "
                f"not {value!r} ({type(value).__name__})"
            )
        return value

    def update(self, name: str, value: Any) -> None:
        """Set a setting for the rest of the process, as `jax.config.update` does.

        >>> import accy
        >>> accy.config.update("debug_nans", True); accy.config.debug_nans
        True
        >>> accy.config.update("debug_nans", False)
        """
        setting = self._setting(name)
        self._values[name] = self.__dict__[name] = self._checked(setting, value)

    @contextlib.contextmanager
    def override(self, **values: Any) -> Iterator[None]:
        """Set settings inside a `with` block; the previous values come back after it."""
        before = {name: getattr(self, name) for name in values}
        for name, value in values.items():
            self.update(name, value)
        try:
            yield
        finally:
            self._values.update(before)
            self.__dict__.update(before)

    def code_key(self) -> tuple[tuple[str, Any], ...]:
        """The settings that change generated code, with their values: part of every compile
        cache key.

        >>> import accy
        >>> isinstance(accy.config.code_key(), tuple)
        True
        """
        return tuple(
            (name, getattr(self, name))
            for name, setting in sorted(self._settings.items())
            if setting.changes_generated_code
        )

    def environment(self, name: str) -> str | None:
        """A variable of the environment accy reads but does not own (`CC`, `CUDA_HOME`,
        `RANK`), or None where it is unset: the one door to `os.environ` outside the settings.

        >>> import accy
        >>> accy.config.environment("ACCY_SURELY_UNSET_VARIABLE") is None
        True
        """
        return os.environ.get(name)


config = Config()
