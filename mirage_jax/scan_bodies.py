"""Loop bodies optimised like functions: a `jax.lax.scan` (layers stacked and scanned, as large
models are often written) is opaque to the capture, so its body, where all the work is, would
reach no search. Each scan body is wrapped in a `mirage_jax.jit` of its own (same options,
same cache) and the scan re-bound with the body that jit traces to: kernels inside the loop,
found and checked once for every iteration.

`with_scan_bodies(program, inner)` is the captured function with its scans' bodies replaced
(scans inside `jit`/`closed_call` bodies too; scans inside custom-derivative rules stay as they
are); callers check `has_scan` first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.extend import core as jex_core

from lax_ir.capture import call_body
from mirage_jax.assemble import bind_equation

CALLS = ("pjit", "jit", "closed_call", "core_call")
"""Call primitives whose bodies are searched for scans (their `jaxpr` or `call_jaxpr`)."""


def has_scan(closed: Any) -> bool:
    """Does the jaxpr contain a scan (in its own equations or a call's body)?"""
    for eqn in closed.jaxpr.eqns:
        if eqn.primitive.name == "scan":
            return True
        body = _call_body(eqn)
        if body is not None and has_scan(body):
            return True
    return False


def _call_body(eqn: Any) -> Any:
    """The body of a plain call (`CALLS`), or None (custom-derivative calls are left alone)."""
    return call_body(eqn) if eqn.primitive.name in CALLS else None


def with_scan_bodies(program: Any, inner: Callable[[Callable], Callable]) -> Callable[..., Any]:
    """The function `program` was captured from (`lax_ir.capture`: its traced jaxpr, pytree
    signature, static arguments and outputs), each scan's body replaced by `inner(body)` (a
    `mirage_jax.jit` of the flat body)."""
    import lax_ir

    closed = program.meta["jaxpr"]
    memo: dict[int, Any] = {}
    return lax_ir.as_function(program, lambda xs: _eval(closed, list(xs), inner, memo))


def _eval(closed: Any, args: list, inner: Callable, memo: dict) -> list:
    """Bind `closed`'s equations as `jax.core.eval_jaxpr` does, each scan with its body
    optimised (`_scan`) and each call holding a scan inlined."""
    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        return v.val if isinstance(v, jex_core.Literal) else env[v]

    env.update(zip(closed.jaxpr.constvars, closed.consts))
    env.update(zip(closed.jaxpr.invars, args))
    for eqn in closed.jaxpr.eqns:
        vals = [read(v) for v in eqn.invars]
        body = _call_body(eqn)
        if eqn.primitive.name == "scan":
            outs = _scan(eqn, vals, inner, memo)
        elif body is not None and has_scan(body):
            outs = _eval(body, vals, inner, memo)
        else:
            outs = bind_equation(eqn, vals)
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in closed.jaxpr.outvars]


def _scan(eqn: Any, vals: list, inner: Callable, memo: dict) -> list:
    """The scan of `eqn` through `jax.lax.scan` (its public form, the same in every jax
    version), its body the `mirage_jax.jit` `inner` makes of the traced one. Where that body
    does not give the scan's types back, the equation is bound as it was."""
    body = eqn.params["jaxpr"]
    closed = body if hasattr(body, "consts") else jex_core.ClosedJaxpr(body, ())
    if id(body) not in memo:
        memo[id(body)] = (body, inner(jex_core.jaxpr_as_fun(closed)))  # body kept: its id stays
    fn = memo[id(body)][1]
    n_consts, n_carry = _counts(eqn.params)
    consts, carry, xs = (
        vals[:n_consts],
        vals[n_consts : n_consts + n_carry],
        vals[n_consts + n_carry :],
    )

    def step(c: list, x: list) -> tuple[list, list]:
        outs = list(fn(*consts, *c, *x))
        return outs[:n_carry], outs[n_carry:]

    try:
        carry_out, ys = jax.lax.scan(
            step, list(carry), list(xs), length=eqn.params["length"],
            reverse=eqn.params["reverse"], unroll=eqn.params.get("unroll", 1),
        )  # fmt: skip
    except TypeError as e:  # the body's types changed (a weak type, say): the scan as it was
        from mirage_jax._env import warn_once

        warn_once(f"scan-body:{id(body)}", f"mirage_jax: a scan body kept as traced ({e})")
        return bind_equation(eqn, vals)
    return [*carry_out, *ys]


def _counts(params: dict) -> tuple[int, int]:
    """(constants, carry values) among a scan equation's operands."""
    if "num_consts" in params:  # jax up to 0.11
        return int(params["num_consts"]), int(params["num_carry"])
    groups = params["ft_in"].unpack()  # jax 0.12: flat trees of (consts, carry, xs)
    return len(list(groups[0].vals)), len(list(groups[1].vals))
