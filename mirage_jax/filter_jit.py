"""`filter_jit`: `mirage_jax.jit` for functions of equinox modules, as `equinox.filter_jit` is.

`jax.jit` (and `mirage_jax.jit`) traces every leaf of the arguments. Equinox modules hold
leaves that are no arrays: `eqx.nn.Dropout`'s `inference` flag, `eqx.nn.MLP`'s activation
function, Python numbers. Traced, a flag that the module branches on fails
(`TracerBoolConversionError`) and a function is no valid JAX type, so equinox users compile
with `eqx.filter_jit`, which traces the arrays and holds every other leaf static.
`filter_jit` does the same around `mirage_jax.jit`: the arrays (`jax.Array`, `np.ndarray`,
`np.generic`) are traced, every other leaf is part of the signature (a new value compiles and
resolves again, as in `eqx.filter_jit`), and the outputs may hold non-array leaves too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax

from mirage_jax.api import MirageJit
from mirage_jax.static_leaves import is_array
from mirage_jax.static_value import Static, same

_DYNAMIC = object()  # marks a traced leaf's place among the static leaves


class _Signature:
    """The static half of a call: the arguments' tree and their non-array leaves (hashable,
    as `jax.jit`'s static arguments must be)."""

    def __init__(self, tree: Any, leaves: tuple[Any, ...]):
        self.tree, self.leaves = tree, leaves

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Signature)
            and self.tree == other.tree
            and len(self.leaves) == len(other.leaves)
            and all(a is b or same(a, b) for a, b in zip(self.leaves, other.leaves))
        )

    def __hash__(self) -> int:
        return hash((self.tree, self.leaves))


def _traced(x: Any) -> bool:
    return is_array(x) or isinstance(x, jax.ShapeDtypeStruct)  # specs: `explain`, `trace`


def _split(tree_value: Any) -> tuple[Any, tuple[Any, ...], list[Any]]:
    """A pytree's tree, its leaves with the traced ones marked `_DYNAMIC`, and the traced
    leaves in their places (None elsewhere)."""
    leaves, tree = jax.tree_util.tree_flatten(tree_value)
    static = tuple(_DYNAMIC if _traced(x) else x for x in leaves)
    dynamic = [x if _traced(x) else None for x in leaves]
    return tree, static, dynamic


class FilterJit:
    """A function compiled by `filter_jit`. `.jit` is the `MirageJit` inside; `last`,
    `records`, `stats` and `scan_bodies` are its."""

    def __init__(self, fn: Callable[..., Any], donate: str, jit_kwargs: dict[str, Any]):
        if donate not in ("none", "all", "all-except-first"):
            raise ValueError(
                f"filter_jit: donate must be 'none', 'all' or 'all-except-first', got {donate!r}"
            )
        self.fn, self.donate = fn, donate

        @functools.wraps(fn)
        def combined(signature: _Signature, kept: tuple, donated: tuple) -> Any:
            args, kwargs = _merge(signature.tree, signature.leaves, kept + donated)
            out = fn(*args, **kwargs)
            out_tree, out_static, out_dynamic = _split(out)
            return [x for x in out_dynamic if x is not None], Static((out_tree, out_static))

        del combined.__wrapped__  # jax.jit reads combined's own signature, not fn's
        donate_argnums = None if donate == "none" else 2
        self.jit = MirageJit(
            combined, static_argnums=0, donate_argnums=donate_argnums, **jit_kwargs
        )
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out_dynamic, box = self.jit(*self.jit_args(*args, **kwargs))
        return _merge(*box.value, out_dynamic)

    def jit_args(self, *args: Any, **kwargs: Any) -> tuple[Any, tuple, tuple]:
        """The arguments `.jit` takes for these: the static half, the arrays kept, the arrays
        donated (as `mirage_jax.explain` passes them)."""
        tree, static, dynamic = _split((args, kwargs))
        signature = _Signature(tree, static)
        try:
            hash(signature)
        except TypeError as e:
            bad = next(x for x in static if not _hashable(x))
            raise TypeError(
                f"filter_jit({getattr(self.fn, '__name__', 'function')}): a non-array argument "
                f"leaf of type {type(bad).__name__} is not hashable, so it cannot be held "
                "static; pass it as an array, or mark its field static (`eqx.field(static=True)`)"
            ) from e
        kept, donated = _donation(self.donate, args, dynamic)
        return signature, kept, donated

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else functools.partial(self, obj)

    @property
    def last(self) -> Any:
        """The most recent trace record (`MirageJit.last`)."""
        return self.jit.last

    @property
    def records(self) -> list[Any]:
        """The trace records (`MirageJit.records`)."""
        return self.jit.records

    @property
    def stats(self) -> Any:
        """Traces, captures and fallbacks (`MirageJit.stats`)."""
        return self.jit.stats

    @property
    def scan_bodies(self) -> list[Any]:
        """The jits of the function's scans' bodies (`MirageJit.scan_bodies`)."""
        return self.jit.scan_bodies

    def __repr__(self) -> str:
        return f"<mirage_jax.filter_jit {getattr(self.fn, '__qualname__', self.fn)!r}>"


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def _merge(tree: Any, static: tuple[Any, ...], dynamic: Sequence[Any]) -> Any:
    """The pytree `_split` took apart: the traced leaves back in their `_DYNAMIC` places."""
    leaves = iter(dynamic)
    return jax.tree_util.tree_unflatten(
        tree, [next(leaves) if s is _DYNAMIC else s for s in static]
    )


def _donation(donate: str, args: tuple, dynamic: list[Any]) -> tuple[tuple, tuple]:
    """The traced leaves, split into those kept and those donated (`donate`)."""
    arrays = tuple(x for x in dynamic if x is not None)
    if donate == "none":
        return arrays, ()
    if donate == "all":
        return (), arrays
    n_first = sum(1 for x in jax.tree_util.tree_leaves(args[:1]) if _traced(x))
    return arrays[:n_first], arrays[n_first:]


def filter_jit(
    fn: Callable[..., Any] | None = None,
    *,
    donate: str = "none",
    **jit_kwargs: Any,
) -> Any:
    """`mirage_jax.jit` that traces only the arrays among the arguments' leaves and holds the
    rest static, as `equinox.filter_jit` does; usable as `filter_jit(fn)`, `@filter_jit` and
    `@filter_jit(...)`.

    `donate`: "none", "all" (every traced leaf) or "all-except-first" (all but the first
    argument's), as in `equinox.filter_jit`. Other keywords are `mirage_jax.jit`'s (not its
    static or donate arguments, which the filtering decides).
    """
    taken = {"static_argnums", "static_argnames", "donate_argnums", "donate_argnames"}
    if taken & set(jit_kwargs):
        raise TypeError(
            f"filter_jit: {', '.join(sorted(taken & set(jit_kwargs)))} cannot be given: the "
            "non-array leaves are static and `donate` says what is donated"
        )
    if fn is None:
        return functools.partial(filter_jit, donate=donate, **jit_kwargs)
    if not callable(fn):
        raise TypeError(f"mirage_jax.filter_jit expects a function, got {type(fn).__name__}")
    return FilterJit(fn, donate, jit_kwargs)
