"""The `mirage-jax` command line's arguments: array specs, MODULE:FUNCTION, numbers, keys.

Each parser here raises `UsageError` (or argparse's ArgumentTypeError) with a message that
names the bad value and what to write instead; `mirage_jax.cli.main` prints it as one line.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DTYPES = {
    "f16": "float16",
    "bf16": "bfloat16",
    "f32": "float32",
    "f64": "float64",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "u8": "uint8",
    "u32": "uint32",
    "bool": "bool",
    "pred": "bool",
}
_SPEC = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\[([^\[\]]*)\]\s*$")
_DIMS = re.compile(r"^\s*(\d+\s*(,\s*\d+\s*)*)?$")


def parse_arg(text: str) -> Any:
    """`f16[2,4096]` → a ShapeDtypeStruct; anything else → a Python literal (a static value)."""
    import jax
    import jax.numpy as jnp

    m = _SPEC.match(text)
    if m:
        name, dims = m.group(1), m.group(2)
        try:
            dtype = jnp.dtype(DTYPES.get(name, name))
        except TypeError:
            raise UsageError(
                f"unknown dtype {name!r} in {text!r}; use e.g. f16, bf16, f32"
            ) from None
        if not _DIMS.match(dims):
            raise UsageError(
                f"array spec {text!r} has malformed dimensions [{dims}]: write DTYPE[d0,d1,...] "
                "with non-negative integers separated by single commas, or DTYPE[] for a scalar"
            )
        shape = tuple(int(d) for d in dims.split(",")) if dims.strip() else ()
        return jax.ShapeDtypeStruct(shape, dtype)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise UsageError(
            f"--arg {text!r} is neither an array spec like f16[2,4096] nor a Python literal"
        ) from None


def load_function(target: str) -> Callable[..., Any]:
    """`package.module:function` or `path/to/file.py:function` (attribute paths allowed)."""
    if ":" not in target:
        raise UsageError(f"expected MODULE:FUNCTION, got {target!r}")
    module_name, _, attr = target.rpartition(":")
    if module_name.endswith(".py") or "/" in module_name:
        path = Path(module_name).resolve()
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    else:
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        module = importlib.import_module(module_name)
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{target} is not callable")
    return obj


class UsageError(ValueError):
    """A bad command line (printed as one line without a traceback; exit status 2)."""


class CommandError(RuntimeError):
    """A command that could not do its job (printed as one line; exit status 1)."""


def function_and_args(target: str, specs: list[str]) -> tuple[Callable[..., Any], list[Any]]:
    """The function of MODULE:FUNCTION and its --arg values, checked by tracing it once."""
    try:
        fn = load_function(target)
    except UsageError:
        raise
    except Exception as e:
        raise UsageError(f"cannot load {target}: {type(e).__name__}: {e}") from e
    values = [parse_arg(a) for a in specs]
    _check_call(fn, values, target)
    return fn, values


def _check_call(fn: Callable[..., Any], values: list[Any], target: str) -> None:
    """UsageError unless `fn` accepts `values` and traces on them (shapes that fit)."""
    import jax

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature (a builtin): let the trace tell
        sig = None
    if sig is not None:
        try:
            sig.bind(*values)
        except TypeError:
            raise UsageError(
                f"{target} takes {_arity(sig)}, got {len(values)} --arg value(s); "
                "pass one --arg per positional argument"
            ) from None
    static = static_argnums(values)
    arrays = [v for i, v in enumerate(values) if i not in static]

    def call(*xs: Any) -> Any:
        it = iter(xs)
        return fn(*[v if i in static else next(it) for i, v in enumerate(values)])

    try:
        jax.eval_shape(call, *arrays)
    except Exception as e:
        raise UsageError(
            f"{target} fails on these --arg values ({type(e).__name__}: {one_line(e)}); "
            "check the shapes and dtypes of each --arg"
        ) from None


def _arity(sig: inspect.Signature) -> str:
    """E.g. "2 positional arguments (x, w)" or "2 to 3 ..." for a signature."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = [p for p in sig.parameters.values() if p.kind in kinds]
    required = [p for p in params if p.default is inspect.Parameter.empty]
    names = ", ".join(p.name for p in params)
    many = "" if len(params) == len(required) else f" to {len(params)}"
    return f"{len(required)}{many} positional argument(s) ({names})"


def one_line(error: BaseException | str, limit: int = 400) -> str:
    """An error message on one line (whitespace collapsed), at most `limit` characters."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def positive_seconds(text: str) -> float:
    """argparse type of --budget-s: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, got {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def at_least_one(text: str) -> int:
    """argparse type of --workers and --batch: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def os_reason(e: OSError) -> str:
    """An OSError's reason without its errno and path ("Permission denied")."""
    return e.strerror or one_line(e)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (and name --help) instead of the usage."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def static_argnums(values: list[Any]) -> tuple[int, ...]:
    import jax

    return tuple(i for i, v in enumerate(values) if not isinstance(v, jax.ShapeDtypeStruct))


def key_prefix(text: str) -> str:
    """A key or key prefix from the command line: hexadecimal, compared literally."""
    prefix = text.strip().lower()
    if not prefix:
        raise UsageError("an empty key prefix matches every entry; give a hexadecimal prefix")
    if not re.fullmatch(r"[0-9a-f]{1,64}", prefix):
        raise UsageError(
            f"key prefix {text!r} is not hexadecimal (keys are sha256 digests; "
            "see mirage-jax cache ls)"
        )
    return prefix
