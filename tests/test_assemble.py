"""`mirage_jax.assemble`: every region of every real model replaced, the traced values kept."""

from __future__ import annotations

import jax
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
