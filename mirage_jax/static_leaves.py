"""Argument leaves that are no arrays: which leaves `filter_jit` traces (`is_array`), and the
note `mirage_jax.jit` adds to an error where the arguments hold others (`hint_static_leaves`),
naming each by its path (`argument_path`, as `nnx_state` names a changed Variable)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def is_array(x: Any) -> bool:
    """Whether `filter_jit` traces this leaf (as `equinox.is_array` decides)."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def argument_path(path: tuple) -> str:
    """`args[0].cache_index` for a key path into (args, kwargs)."""
    text = jax.tree_util.keystr(path)
    for prefix, name in (("[0]", "args"), ("[1]", "kwargs")):
        if text.startswith(prefix):
            return name + text[len(prefix) :]
    return text


def hint_static_leaves(e: BaseException, args: tuple, kwargs: dict) -> None:
    """Add a note to `e` (raised by `mirage_jax.jit`) where the arguments hold leaves that are
    no arrays, such as an equinox module's flag or function: jax.jit traces them, `filter_jit`
    holds them static."""
    odd = [
        (argument_path(path), type(x).__name__)
        for path, x in jax.tree_util.tree_flatten_with_path((args, kwargs))[0]
        if not is_array(x)
    ]
    if odd:
        named = ", ".join(f"{t} at {p}" for p, t in odd[:4])
        named += f" and {len(odd) - 4} more" if len(odd) > 4 else ""
        e.add_note(
            f"mirage_jax.jit traces every argument leaf, as jax.jit does; these are no arrays: "
            f"{named}. mirage_jax.filter_jit holds such leaves static, as equinox.filter_jit "
            "does (or pass them with static_argnums)."
        )
