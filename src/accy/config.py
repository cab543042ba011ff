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

from accy.errors import ConfigurationError


class ConfigError(ConfigurationError):
    """A setting's name is unknown, or its value (given or read from its variable) is invalid."""


def _boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("must be one of 1/0, true/false, yes/no, on/off")


def _whole_number(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError("expected a whole number of at least 0, such as 0 or 2147483648")
    return value


def _number(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ValueError("expected a finite number of at least 0, such as 0, 0.5 or 25")
    return value


def _text(text: str) -> str:
    return text.strip()


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
    Setting(
        "cache_dir",
        "ACCY_CACHE_DIR",
        _text,
        "",
        "The folder of the disk cache of compiled code (empty: ~/.cache/accy). It must be owned "
        "by the user, writable by no one else, on a file system that allows executing programs.",
    ),
    Setting(
        "cache_max_bytes",
        "ACCY_CACHE_MAX_BYTES",
        _whole_number,
        2 * 1024**3,
        "The size bound of each folder of the disk cache, in bytes; the least recently used "
        "entries are removed past it.",
    ),
    Setting(
        "blas_library",
        "ACCY_BLAS_LIBRARY",
        _text,
        "",
        "The path of a BLAS shared library the CPU backend tries before NumPy's own OpenBLAS, "
        "SciPy's and the system's (empty: none); read when a BLAS is first looked for.",
    ),
    Setting(
        "cpu_gemm_kernel",
        "ACCY_CPU_GEMM_KERNEL",
        _boolean,
        True,
        "Native CPU: float32 (and 16-bit) GEMMs run accy's AVX-512 kernel where the CPU has "
        "AVX-512F (off: the BLAS's sgemm for every GEMM).",
        changes_generated_code=True,
    ),
    Setting(
        "cpu_compile_in_parts",
        "ACCY_CPU_COMPILE_IN_PARTS",
        _text,
        "auto",
        "Native CPU: compile a program's steps as two translation units at once, one a core, "
        "then link them (on), as one unit (off), or in two where this process may use two "
        "cores and the 1-minute load average, or the threads running right now, leave one "
        "idle (auto); the library is the same.",
    ),
    Setting(
        "executables_max_entries",
        "ACCY_EXECUTABLES_MAX_ENTRIES",
        _whole_number,
        512,
        "How many compiled executables stay alive in memory (those of accy.compile, jit and "
        "eager operations together); past it the least recently used is released with its "
        "native library and compiled again (from the disk cache) when next needed.",
    ),
    Setting(
        "eager_operations_max_entries",
        "ACCY_EAGER_OPERATIONS_MAX_ENTRIES",
        _whole_number,
        4096,
        "How many operation signatures (kind, attributes, operand types) each device's eager "
        "operations remember, and how many scalar constants; the oldest are forgotten past it.",
    ),
    Setting(
        "jit_signatures_max_entries",
        "ACCY_JIT_SIGNATURES_MAX_ENTRIES",
        _whole_number,
        256,
        "How many traced signatures (argument types and static values) each jitted or "
        "transformed function keeps, with their programs; the oldest are traced again.",
    ),
    Setting(
        "interned_types_max_entries",
        "ACCY_INTERNED_TYPES_MAX_ENTRIES",
        _whole_number,
        65536,
        "How many distinct array types NamedArrays share one object of (the fast paths compare "
        "types by identity); past it the oldest are forgotten, which only costs a slower lookup.",
    ),
    Setting(
        "kernels_max_entries",
        "ACCY_KERNELS_MAX_ENTRIES",
        _whole_number,
        256,
        "How many compiled kernels of custom calls and attention (with their loaded libraries "
        "and modules) each kernel table keeps; the oldest are released past it.",
    ),
    Setting(
        "lower_epilogue_window",
        "ACCY_LOWER_EPILOGUE_WINDOW",
        _whole_number,
        8,
        "How many steps after a reduction the fusion planner searches for elementwise work to "
        "fuse into its epilogue (0: none).",
        changes_generated_code=True,
    ),
    Setting(
        "lower_chain_window",
        "ACCY_LOWER_CHAIN_WINDOW",
        _whole_number,
        8,
        "How many steps the fusion planner searches for the next phase of a chain of reductions "
        "over the same rows (0: no chains).",
        changes_generated_code=True,
    ),
    Setting(
        "lower_chain_trailing_loops",
        "ACCY_LOWER_CHAIN_TRAILING_LOOPS",
        _boolean,
        True,
        "Let a chain of reductions end with an elementwise loop that does not write in place.",
        changes_generated_code=True,
    ),
    Setting(
        "lower_convert_inside_scans",
        "ACCY_LOWER_CONVERT_INSIDE_SCANS",
        _boolean,
        False,
        "On a GPU, make a conversion that only scans read (mixed precision's bf16 copy of stacked "
        "f32 layer weights) inside each scan's body, a layer's slice at a time: the whole copy "
        "never exists (1.7 GB less at the peak of the 1B Llama's step), for a second conversion "
        "in the backward scan (5.6 GB more traffic, ~1.3 ms of that step on an H200).",
        changes_generated_code=True,
    ),
    Setting(
        "lower_smallest_split",
        "ACCY_LOWER_SMALLEST_SPLIT",
        _whole_number,
        1 << 22,
        "The fewest multiply-adds of a contraction that the planner splits into GEMMs per "
        "operand block.",
        changes_generated_code=True,
    ),
    Setting(
        "cuda_unrolled_nodes",
        "ACCY_CUDA_UNROLLED_NODES",
        _whole_number,
        16384,
        "CUDA: a scan of at most this many graph nodes (length times body steps) is unrolled "
        "into the CUDA graph; a longer one runs as a WHILE node.",
        changes_generated_code=True,
    ),
    Setting(
        "cuda_iterations_per_node_iteration",
        "ACCY_CUDA_ITERATIONS_PER_NODE_ITERATION",
        _whole_number,
        8,
        "CUDA: how many scan iterations one iteration of a WHILE node's body runs (its body "
        "recorded that many times).",
        changes_generated_code=True,
    ),
    Setting(
        "cuda_cublas_in_conditionals",
        "ACCY_CUDA_CUBLAS_IN_CONDITIONALS",
        _boolean,
        True,
        "CUDA: run wide GEMMs inside graph conditional (WHILE) nodes through cuBLAS rather than "
        "accy's own kernels.",
        changes_generated_code=True,
    ),
    Setting(
        "cpu_conv",
        "ACCY_CPU_CONV",
        _boolean,
        True,
        "CPU: run convolutions as accy's tiled implicit-GEMM kernel (off: the im2col composition).",
        changes_generated_code=True,
    ),
    Setting(
        "cpu_pool",
        "ACCY_CPU_POOL",
        _boolean,
        True,
        "CPU: run windowed reductions (pooling) as one-pass loops (off: their compositions).",
        changes_generated_code=True,
    ),
    Setting(
        "cudnn_conv",
        "ACCY_CUDNN_CONV",
        _boolean,
        True,
        "CUDA: run the convolutions cuDNN supports through cuDNN (off: accy's composed kernels).",
        changes_generated_code=True,
    ),
    Setting(
        "cudnn_attention",
        "ACCY_CUDNN_ATTENTION",
        _boolean,
        True,
        "CUDA: run attention through cuDNN's fused attention where it applies (off: accy's "
        "kernels).",
        changes_generated_code=True,
    ),
    Setting(
        "cudnn_min_blocks",
        "ACCY_CUDNN_MIN_BLOCKS",
        _whole_number,
        0,
        "CUDA: a long sequence (1,024 tokens or more) whose attention makes fewer cuDNN thread "
        "blocks than this is composed instead of fused (0: never declines for this).",
        changes_generated_code=True,
    ),
    Setting(
        "nccl_bucket_mb",
        "ACCY_NCCL_BUCKET_MB",
        _number,
        25.0,
        "Data parallelism over NCCL: the size in MiB of the buckets gradients are all-reduced "
        "in, overlapped with the backward pass (0: no buckets, every psum on the step's stream).",
        changes_generated_code=True,
    ),
    Setting(
        "nccl_graph",
        "ACCY_NCCL_GRAPH",
        _boolean,
        True,
        "Data parallelism over NCCL: capture a step with its collectives as one CUDA graph where "
        "it can be (off: run it as segments between collectives).",
    ),
    Setting(
        "explain_cache_misses",
        "ACCY_EXPLAIN_CACHE_MISSES",
        _boolean,
        False,
        "Log a warning (logger accy.compile) each time a jitted function is traced, saying "
        "what differs from its closest earlier signature: a never-seen function, the input "
        "tree structure, the types at which leaves, or the static arguments' values.",
    ),
    Setting(
        "default_device",
        "ACCY_DEFAULT_DEVICE",
        _text,
        "cpu",
        "Where new arrays from host data and calls without array arguments go (accy.named, "
        "random keys, a jitted function of scalars): cpu, cuda, cuda:N or reference; an "
        "array's own device always wins (`with accy.default_device(d):` sets it for a block).",
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

    def page(self) -> str:
        """The settings as a Markdown page: docs/config.md is this text.

        >>> import accy
        >>> "| `debug_nans` | `ACCY_DEBUG_NANS` | bool | `False` |" in accy.config.page()
        True
        """
        lines = [
            "# Settings (`accy.config`)",
            "",
            "Every setting of accy, generated from `accy.config.SETTINGS` "
            "(`accy.config.page()`). Read one as",
            "`accy.config.name`; set one with its variable before the first use, with",
            '`accy.config.update("name", value)` for the rest of the process, or with',
            "`with accy.config.override(name=value):` for a block. Settings that change generated "
            "code (*code*)",
            "are part of every compile cache key (`accy.config.code_key()`), so code built under "
            "one value is",
            "never reused under another.",
            "",
            "| setting | variable | type | default | code | meaning |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for setting in self._settings.values():
            code = "yes" if setting.changes_generated_code else ""
            lines.append(
                f"| `{setting.name}` | `{setting.variable}` | {setting.kind.__name__} | "
                f"`{setting.default!r}` | {code} | {setting.meaning} |"
            )
        return "\n".join(lines) + "\n"

    def environment(self, name: str) -> str | None:
        """A variable of the environment accy reads but does not own (`CC`, `CUDA_HOME`,
        `RANK`), or None where it is unset: the one door to `os.environ` outside the settings.

        >>> import accy
        >>> accy.config.environment("ACCY_SURELY_UNSET_VARIABLE") is None
        True
        """
        return os.environ.get(name)

    def set_environment(self, name: str, value: str, *, keep_existing: bool = False) -> None:
        """Set a variable that a library accy loads reads when it starts (OpenMP's
        `OMP_WAIT_POLICY`, CUDA's `CUDA_VISIBLE_DEVICES`); with `keep_existing`, only where it
        is unset (the user's choice wins).

        >>> import accy
        >>> accy.config.set_environment("ACCY_EXAMPLE_VARIABLE", "1", keep_existing=True)
        >>> accy.config.environment("ACCY_EXAMPLE_VARIABLE")
        '1'
        """
        if keep_existing:
            os.environ.setdefault(name, value)
        else:
            os.environ[name] = value


config = Config()


def child_environment(**variables: str) -> dict[str, str]:
    """The environment for a child process: this process's whole environment with `variables`
    set (what `accy launch` gives each rank); like `environment`, a door to `os.environ`.

    >>> child_environment(RANK="3")["RANK"]
    '3'
    """
    return {**os.environ, **variables}
