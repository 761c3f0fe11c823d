"""`mirage_jax.assemble`: every region of every real model replaced, the traced values kept."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lax_ir
from experiments import models as M
from lax_ir.interface import adapt
from mirage_jax.assemble import assemble


def _own(program):
    """A stand-in kernel: the region's program itself, taking and giving its own values."""
    return adapt(lambda *xs: lax_ir.evaluate(program, *xs), program)


@pytest.mark.parametrize("name", M.names())
def test_every_region_replaced_matches_jax(name: str) -> None:
    """Every non-trivial region is replaced, none is skipped (a region output with no place
    in the jaxpr, such as equinox's [N, 1] matmul behind a vmapped Linear, gets one that later
    regions read), and the function computes what jax.jit does."""
    m = M.get(name, batch=1, size="tiny")
    case = m.make(0)
    program = lax_ir.capture(m.fn, *case.args)
    part = lax_ir.partition(program)
    replacements = {r.index: _own(r.program) for r in part.regions if not r.is_trivial}
    asm = assemble(program, part, replacements)
    assert not asm.skipped, asm.skipped
    assert set(asm.substituted) == set(replacements)
    got = jax.jit(lax_ir.as_function(program, asm.fn))(*case.args)
    want = jax.jit(m.fn)(*case.args)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-3, atol=2e-3)


def test_each_replaced_region_is_traced_under_its_own_name_scope() -> None:
    """Region k's kernel is traced under `mirage_jax.region{k}` (`assemble.REGION_SCOPE`): its
    ops' op_name carries it, so a profiler trace can tell the region's kernels apart."""
    from mirage_jax.assemble import REGION_SCOPE

    m = M.get("llama_decode_nnx", batch=1, size="tiny")
    case = m.make(0)
    program = lax_ir.capture(m.fn, *case.args)
    part = lax_ir.partition(program)
    replacements = {r.index: _own(r.program) for r in part.regions if not r.is_trivial}
    asm = assemble(program, part, replacements)
    fn = jax.jit(lax_ir.as_function(program, asm.fn))
    text = fn.lower(*case.args).as_text(debug_info=True)
    for k in asm.substituted:
        assert REGION_SCOPE.format(k) + "/" in text, k


def _dots(closed) -> int:
    """The dot_general equations of a jaxpr, its calls' bodies included."""
    n = 0
    for eqn in closed.jaxpr.eqns:
        n += eqn.primitive.name == "dot_general"
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                if hasattr(sub, "jaxpr") and hasattr(sub, "consts"):
                    n += _dots(sub)
                elif hasattr(sub, "eqns"):
                    n += _dots(jax.extend.core.ClosedJaxpr(sub, ()))
    return n


def _reads_all(avals):
    """A stand-in kernel with no matmul that reads every input (so what computes them stays)."""

    def kernel(*xs):
        touch = sum(jnp.sum(x).astype(jnp.float32) for x in xs) * 0
        return [(jnp.zeros(s, jnp.float32) + touch).astype(d) for s, d in avals]

    return kernel


@pytest.mark.parametrize("name", M.names())
def test_a_replaced_region_leaves_no_matmul_to_xla(name: str) -> None:
    """With one region replaced (by a stand-in with no matmul), the function binds exactly its
    other matmuls: none of the region's stays alive in XLA's part. Equinox's vmapped `Linear`
    is the case: the region's [N, 1] matmul has no place in the jaxpr, XLA's equations read
    the placed reshape of it, which the kernel op now writes too (before, the traced
    `dot_general` ran a second time: a 28 µs GEMV at Llama-7B size on the H200)."""
    m = M.get(name, batch=1, size="tiny")
    case = m.make(0)
    program = lax_ir.capture(m.fn, *case.args)
    part = lax_ir.partition(program)
    whole = _dots(jax.make_jaxpr(m.fn)(*case.args))
    for r in part.regions:
        matmuls = sum(n.op == "matmul" for _, n in r.program.ops())
        if r.is_trivial or not matmuls:
            continue
        avals = r.program.output_avals
        asm = assemble(program, part, {r.index: adapt(_reads_all(avals), r.program)})
        assert asm.substituted == (r.index,), asm.skipped
        fn = lax_ir.as_function(program, asm.fn)
        got = _dots(jax.make_jaxpr(fn)(*case.args))
        assert got == whole - matmuls, (
            f"region {r.index}: {got} matmuls bound, not {whole - matmuls}"
        )
