"""`Static`: a value carried through `jax.jit`'s outputs as part of the output's tree.

A leafless pytree whose value is its tree's auxiliary data, so each compiled signature keeps
its own (the non-array outputs of `filter_jit`, the output graph definition of a stateful nnx
call). The value need not be hashable: equality decides.
"""

from __future__ import annotations

from typing import Any

import jax


def same(a: Any, b: Any) -> bool:
    """`a == b` as a bool; values that do not compare are equal only when identical."""
    try:
        return bool(a == b)
    except Exception:
        return a is b


@jax.tree_util.register_static
class Static:
    """A value carried through `jax.jit` in the output's tree (see the module)."""

    def __init__(self, value: Any):
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Static) and same(self.value, other.value)

    def __hash__(self) -> int:
        return 0  # values need not be hashable; equality decides
