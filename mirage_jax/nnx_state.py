"""flax nnx modules whose state a call changes: carried out of `mirage_jax.jit` as `nnx.jit`
carries it.

An nnx module is a pytree, so `jax.jit` takes it as an argument; but a change the function
makes to its state (a decode cache and its index in `nnx.MultiHeadAttention(decode=True)`, a
counter, batch statistics) lands on the copies the trace made and is dropped silently. The
capture watches the arguments' `nnx.Variable`s (`watch`); where the function changes one, the
call goes instead through `Stateful`: the arguments are split into a graph definition (static)
and their state, the function runs on them merged, and the state it leaves is written back
into the caller's modules (`nnx.update`), as `nnx.jit` does.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import jax

from mirage_jax.static_leaves import argument_path
from mirage_jax.static_value import Static


class StateMutation(Exception):
    """The captured function changed the state of an nnx module among its arguments."""

    def __init__(self, paths: list[str]):
        super().__init__(f"the function changes nnx state at {', '.join(paths[:4])}")
        self.paths = paths


def _nnx() -> Any:
    return sys.modules.get("flax.nnx")  # only where the caller uses nnx (never imported here)


def _variables(tree: Any) -> list[tuple[str, Any, Any]]:
    """(path, Variable, its value) for each `nnx.Variable` in `tree`."""
    nnx = _nnx()
    if nnx is None:
        return []
    found = jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )[0]
    return [(argument_path(p), v, v.get_value()) for p, v in found if isinstance(v, nnx.Variable)]


def watch(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, raising `StateMutation` where it changes a Variable of its arguments (its value
    replaced, or the Variable itself) rather than return the change."""
    if _nnx() is None:
        return fn

    @functools.wraps(fn)
    def watched(*args: Any, **kwargs: Any) -> Any:
        before = _variables((args, kwargs))
        out = fn(*args, **kwargs)
        if before:
            after = _variables((args, kwargs))
            changed = [
                p
                for (p, v, x), (_, v2, _) in zip(before, after)
                if v is not v2 or v.get_value() is not x
            ]
            if len(after) != len(before):
                changed = changed or ["the modules' structure"]
            if changed:
                raise StateMutation(changed)
        return out

    return watched


class Stateful:
    """Calls of a `MirageJit` whose function changes nnx state: the function runs on the
    arguments' graph definition (static) and state, and the state it leaves is written back."""

    def __init__(self, outer: Any, cause: StateMutation):
        refused = {k: v for k, v in outer._jit_kwargs.items() if v is not None}
        if refused:
            raise TypeError(
                f"mirage_jax.jit({outer._name}): the function changes nnx state "
                f"({', '.join(cause.paths[:4])}); mirage_jax.jit carries that state out as "
                f"nnx.jit does, but not with {', '.join(sorted(refused))}: pass the changing "
                "state as arrays and return it, or leave those arguments out"
            ) from cause
        nnx, fn = _nnx(), outer.fn

        @functools.wraps(fn)
        def stateful(graphdef: Any, state: Any) -> Any:
            args, kwargs = nnx.merge(graphdef, state)
            out = fn(*args, **kwargs)
            out_def, out_state = nnx.split(out)
            return out_state, Static(out_def), nnx.state((args, kwargs), nnx.Variable)

        del stateful.__wrapped__  # jax.jit reads stateful's own signature, not fn's
        inner = outer.with_options(fn=stateful)
        inner._watch = False  # its function returns the state it changes
        inner.records, inner.stats, inner.scan_bodies = (
            outer.records,
            outer.stats,
            outer.scan_bodies,
        )
        self.inner, self.paths = inner, cause.paths

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        nnx = _nnx()
        graphdef, state = nnx.split((args, kwargs))
        out_state, box, new_state = self.inner(graphdef, state)
        nnx.update((args, kwargs), new_state)
        return nnx.merge(box.value, out_state)
