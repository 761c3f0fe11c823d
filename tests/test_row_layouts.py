"""Rows merged before a projection (`lax_ir.row_layouts`) and the capture's identities: a norm
over (B, T, D) read by its projection as (B·T, D) rows, written as flax linen, flax nnx's
`Einsum` and plain jnp write it, reaches the search."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lax_ir
from mirage_jax.search.diagnose import blockers
from tests.conftest import capture_hoisted


def _args(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _rms(x, g):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g


def test_a_norm_over_sequences_read_as_rows_is_computed_on_rows():
    """`rms(x).reshape(B·T, D) @ w`: the norm runs on (B·T, D) with x merged at the interface."""
    args = _args(0, (2, 8, 32), (32,), (32, 48))
    program, hoisted = capture_hoisted(lambda x, g, w: _rms(x, g).reshape(16, 32) @ w, *args)
    assert any("merges or splits" in b for b in blockers(program))
    assert not blockers(hoisted), hoisted.pretty()
    assert "reshape" not in hoisted.op_counts() or all(
        len(hoisted.nodes[n.args[0]].shape) <= 2 for n in hoisted.nodes if n.op == "reshape"
    )


def test_a_normed_value_that_goes_on_in_its_own_shape_is_not_computed_twice():
    """The normed (B, T, D) value is also an output: rewriting its cone would compute the
    norm twice, so the merge stays (and the region keeps its blocker)."""
    args = _args(1, (2, 8, 32), (32,), (32, 48))

    def fn(x, g, w):
        h = _rms(x, g)
        return h.reshape(16, 32) @ w, h

    program, hoisted = capture_hoisted(fn, *args)
    assert any("merges or splits" in b for b in blockers(hoisted))


def test_the_weight_first_einsum_of_a_norm_reads_rows():
    """`W @ rms(x)ᵀ` in the form nnx's `Einsum("btd,dshk->sbthk")` captures (the feature axis
    moved to the front, the rows merged after it) becomes `rows @ Wᵀ`."""
    args = _args(2, (2, 8, 32), (32,), (48, 32))

    def fn(x, g, w):
        h = jnp.transpose(_rms(x, g), (2, 0, 1)).reshape(32, 16)
        return w @ h

    program, hoisted = capture_hoisted(fn, *args)
    assert blockers(program)
    assert not blockers(hoisted), hoisted.pretty()
    assert "transpose" not in hoisted.op_counts()


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x - jnp.zeros_like(x),
        lambda x: jnp.zeros((2, 8, 1)) + x,
        lambda x: x * jnp.ones((8, 32)),
    ],
)
def test_adding_zeros_or_multiplying_by_ones_is_the_value(fn):
    """flax's RMSNorm subtracts a mean of zeros: the capture keeps x, not `x - zeros` (which
    the search cannot build); a scalar 0 or 1 stays, a scalar op the search reads."""
    (x,) = _args(3, (2, 8, 32))
    program = lax_ir.capture(lambda x: jnp.tanh(fn(x)), x)
    assert program.op_counts() == {"tanh": 1}, program.pretty()
    assert "add" in lax_ir.capture(lambda x: jnp.tanh(x + 0.0), x).op_counts()


def test_nnx_rms_norm_and_einsum_projection_reach_the_search():
    """An nnx block of `RMSNorm` then `Einsum("btd,dshk->sbthk")` (Gemma's q/k/v form) over a
    batch of sequences: its region has no blockers and no `x - 0`."""

    class Proj(nnx.Module):
        def __init__(self, rngs):
            self.norm = nnx.RMSNorm(32, rngs=rngs)
            self.qkv = nnx.Einsum("btd,dshk->sbthk", (32, 3, 4, 8), rngs=rngs)

        def __call__(self, x):
            return self.qkv(self.norm(x))

    graphdef, state = nnx.split(Proj(nnx.Rngs(0)))
    (x,) = _args(4, (2, 8, 32))
    regions = lax_ir.partition(
        lax_ir.capture(lambda s, x: nnx.merge(graphdef, s)(x), state, x)
    ).regions
    (region,) = [r for r in regions if not r.is_trivial]
    assert not blockers(region.program), region.program.pretty()
    assert "sub" not in region.program.op_counts()


def test_a_bias_converted_to_the_compute_dtype_is_taken_as_it_broadcasts():
    """flax linen's `Dense(dtype=bfloat16)` over float32 parameters converts its [1, 1, N]
    bias inside the region: the rows' rules take `convert(bias)` as they take a bias
    (`layout_graph.input_chain`), so the MLP between two projections is one row-form region."""
    import flax.linen as nn

    class Mlp(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.Dense(48, dtype=jnp.bfloat16, param_dtype=jnp.float32)(nn.RMSNorm()(x))
            return nn.Dense(32, dtype=jnp.bfloat16, param_dtype=jnp.float32)(nn.swish(h))

    m = Mlp()
    (x,) = _args(4, (2, 8, 32))
    params = m.init(jax.random.key(0), x)
    leaves, tree = jax.tree.flatten(params)

    def fn(*a):
        return m.apply(jax.tree.unflatten(tree, a[:-1]), a[-1])

    program, hoisted = capture_hoisted(fn, *leaves, x)
    assert any("merges or splits" in b for b in blockers(program))
    assert not blockers(hoisted), hoisted.pretty()
    assert all(len(n.shape) <= 2 for n in hoisted.nodes), hoisted.pretty()
    assert hoisted.op_counts()["convert"] >= 2  # the biases' converts stay in the region


def test_a_vector_converted_beside_merged_axes_does_not_stop_the_partition():
    """`canonical.flatten_rows` met a rank-1 elementwise op (a float32 bias converted to
    bfloat16) in a region whose merged leading axes it flattens (here a weight's, [H, hd, D]
    read as [H·hd, D], as linen's attention output projection reads it) and indexed past the
    op's shape: the capture of flax blocks with float32 parameters and bfloat16 compute
    failed, and they ran as XLA."""

    def fn(x, b, w):
        y = x.reshape(16, 32) @ w.astype(jnp.bfloat16).reshape(32, 32)
        return y.reshape(2, 8, 32) + b.astype(jnp.bfloat16)

    from lax_ir.canonical import flatten_rows

    x, b, w = _args(5, (2, 8, 4, 8), (32,), (4, 8, 32))
    x = jnp.asarray(x, jnp.bfloat16)
    program = lax_ir.capture(fn, x, b, w)
    flat = flatten_rows(program)  # raised IndexError
    got = lax_ir.evaluate(
        flat,
        *[
            np.asarray(a).reshape(n.shape)
            for a, n in zip((x, b, w), (flat.nodes[i] for i in flat.inputs))
        ],
    )
    np.testing.assert_array_equal(np.asarray(got[0]).reshape(2, 8, 32), np.asarray(fn(x, b, w)))
