"""Transposes inside a region that flax's own attention writes (`lax_ir.layouts`,
`lax_ir.pieces`): V plus its heads' bias laid out for P V by two transposes, the output
projection's rows split back into (batch, tokens) before its bias, and an elementwise op on a
transposed product with an input of its shape. Each moves to the interface; the region keeps its
meaning and reaches the search."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import lax_ir
from mirage_jax.search.diagnose import blockers
from tests.conftest import capture_hoisted


def _args(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def test_an_op_on_a_transposed_product_takes_its_input_operand_transposed_back():
    """`W @ exp(x v)ᵀ + r`: the product becomes `(exp(x v) Wᵀ)ᵀ`, its transpose sinks past the
    add, and r (the add's input of the op's shape) is transposed back at the interface."""
    args = _args(0, (8, 16), (16, 16), (32, 16), (32, 8))
    program, hoisted = capture_hoisted(lambda x, v, w, r: jnp.tanh(w @ jnp.exp(x @ v).T + r), *args)
    assert "transpose" in program.op_counts() and "transpose" not in hoisted.op_counts()
    assert not blockers(hoisted), hoisted.pretty()


def test_values_v_plus_bias_laid_out_by_two_transposes_reach_the_interface():
    """flax's attention: `(V + b)` transposed to (B, H, D, T), then to (B, H, T, D), read by
    P V. The two are one transpose, which moves to V and the bias at the interface."""
    args = _args(1, (2, 4, 16, 16), (2, 16, 4, 8), (4, 8))

    def fn(s, v, b):
        vt = jnp.transpose(jnp.transpose(v + b, (0, 2, 3, 1)), (0, 1, 3, 2))
        return jax.nn.softmax(s, -1) @ vt

    program, hoisted = capture_hoisted(fn, *args)
    assert any("transpose" in b for b in blockers(program))
    assert not blockers(hoisted), hoisted.pretty()
    assert "transpose" not in hoisted.op_counts()


def test_rows_split_before_a_broadcast_bias_move_to_the_interface():
    """`(x @ w).reshape(2, 16, 64) + b`, b of shape (1, 1, 64): the add runs on the (32, 64)
    product with b reshaped to a row at the interface; the split leaves after the call."""
    args = _args(2, (32, 64), (64, 64), (1, 1, 64))
    program, hoisted = capture_hoisted(lambda x, w, b: (x @ w).reshape(2, 16, 64) + b, *args)
    assert any("merges or splits" in b for b in blockers(program))
    assert not blockers(hoisted), hoisted.pretty()
    assert "reshape" not in hoisted.op_counts()


def test_a_broadcast_splitting_a_regrouped_block_stays():
    """A bias that varies along part of a regrouped block (b of shape (2, 1, 64) against rows
    (32,) split as (2, 16)) has no row layout: the rule leaves the reshape in place."""
    args = _args(3, (32, 64), (64, 64), (2, 1, 64))
    program, hoisted = capture_hoisted(
        lambda x, w, b: jnp.tanh((x @ w).reshape(2, 16, 64) + b), *args
    )
    assert any("merges or splits" in b for b in blockers(hoisted))


def test_flax_prefill_attention_is_three_searchable_pieces():
    """`nnx.MultiHeadAttention(decode=False)` with a causal mask: the q/k/v projections with
    their heads' biases, the attention from Q, K and V, and the output projection with its bias
    are regions without blockers; no bias add is a region of its own."""
    x = jnp.ones((2, 16, 64), jnp.float32)
    graphdef, state = nnx.split(nnx.MultiHeadAttention(4, 64, decode=False, rngs=nnx.Rngs(0)))

    def fn(state, x):
        return nnx.merge(graphdef, state)(x, mask=nnx.make_causal_mask(x[..., 0]))

    regions = lax_ir.partition(lax_ir.capture(fn, state, x)).regions
    searched = [r for r in regions if not r.is_trivial]
    assert [r.program.op_counts().get("matmul", 0) for r in searched] == [3, 1, 2]
    assert [r.program.op_counts().get("add", 0) for r in searched] == [3, 1, 1]  # + the mask
    assert not any(blockers(r.program) for r in searched)
