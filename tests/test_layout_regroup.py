"""Head splits and unit-axis transposes inside a region (flax nnx's `LinearGeneral` and its
vmapped attention): `lax_ir.layouts` moves them to the interface, so the region reaches the
search."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import lax_ir
import mirage_jax
from mirage_jax.search.diagnose import blockers
from tests.conftest import capture_hoisted


def test_a_head_split_before_a_bias_moves_to_the_interface():
    """`(x @ w).reshape(1, 8, 16) + b`: the add runs on the [1, 128] row with the bias
    reshaped at the interface, the split after the call; no blocker is left."""
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((1, 64), (64, 128), (1, 8, 16))]
    program, hoisted = capture_hoisted(
        lambda x, w, b: jnp.tanh((x @ w).reshape(1, 8, 16) + b), *args
    )
    assert any("merges or splits" in b for b in blockers(program))
    assert not blockers(hoisted), hoisted.pretty()
    assert "reshape" not in hoisted.op_counts()


def test_a_transpose_of_unit_axes_is_a_reshape():
    """Moving only unit axes keeps the row-major order: a reshape (the probabilities of nnx's
    vmapped attention laid out for P V), which then collapses into its neighbour."""
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((1, 64), (64, 32), (1, 4, 8, 16))]

    def fn(x, w, v):
        p = jnp.exp(x @ w).reshape(1, 1, 4, 1, 8)
        return jnp.transpose(p, (1, 2, 4, 0, 3)).reshape(1, 4, 1, 8) @ v

    program, hoisted = capture_hoisted(fn, *args)
    assert "transpose" in program.op_counts() and "transpose" not in hoisted.op_counts()
    assert hoisted.op_counts().get("reshape", 0) == 1, hoisted.pretty()


def test_an_nnx_linear_general_projection_gets_a_kernel():
    """LayerNorm then `nnx.LinearGeneral` to (heads, head dim) with a bias, as
    `nnx.MultiHeadAttention` projects: the region is searched and its kernel matches."""

    class Proj(nnx.Module):
        def __init__(self):
            self.ln = nnx.LayerNorm(32, rngs=nnx.Rngs(0))
            self.q = nnx.LinearGeneral(32, (4, 8), rngs=nnx.Rngs(1))

        def __call__(self, x):
            return self.q(self.ln(x))

    m = Proj()
    x = jnp.asarray(np.random.default_rng(2).standard_normal((1, 32)), jnp.float32)
    f = mirage_jax.jit(lambda m, x: m(x), backend="pallas-interpret", cache=False)
    got = f(m, x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.jit(lambda m, x: m(x))(m, x)), 1e-4)
    assert any(d.status == "kernel" for d in f.last.decisions), f.last.decisions


def test_nnx_decode_attention_is_a_piece_of_its_own_without_blockers():
    """`nnx.MultiHeadAttention(decode=True)`'s output projection contracts (heads, head dim):
    the capture's reshape before its matmul has no traced value, so the piece cut is placed
    before it (`lax_ir.pieces.capture_regroups`); the attention and the projection are then
    regions with nothing the search cannot express."""
    from experiments.nnx_builtins import _block, step

    block = _block(1, 8, 32, 4, jnp.float32)
    part = lax_ir.partition(lax_ir.capture(step, block, jnp.ones((1, 1, 32), jnp.float32)))
    searched = [r for r in part.regions if not r.is_trivial]
    attention = [r for r in searched if "exp" in r.program.op_counts()]
    assert len(attention) == 1 and attention[0].program.op_counts()["matmul"] == 2
    for r in searched:
        if r.program.op_counts().get("matmul"):
            assert not blockers(r.program), (r.index, blockers(r.program))
