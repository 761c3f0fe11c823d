"""equinox's `weight @ x`, vmapped over a sequence or a batch (`lax_ir.pieces.lays_out_product`,
`lax_ir.transpose_layouts.product_rule`).

JAX batches `W @ x` into a dot_general whose result is `[out, rows]`, then transposes it back
to rows. That transpose moves data between non-unit dims, so the partition used to run it in
XLA: a GEMM was cut from its epilogue (equinox's MLP: the up-projection in one region, its bias
and GELU the down-projection's prologue, recomputed per output tile), and a product with a
residual add was computed transposed, its inputs and output copied around it. The region now
keeps the swap, and the product becomes `x Wᵀ`: rows in, rows out, W read as a view.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import lax_ir
from lax_ir.partition import run_partition
from mirage_jax.search.diagnose import blockers


def _mlp_blocks(d: int, hidden: int, rows: int):
    """Two pre-LN MLP blocks as an equinox user writes them, `x + mlp(ln(x))` vmapped over
    rows: four GEMMs, more than one region takes (`lax_ir.pieces.MAX_MATMULS`)."""
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    lns = [eqx.nn.LayerNorm(d) for _ in range(2)]
    mlps = [eqx.nn.MLP(d, d, hidden, 1, activation=jax.nn.gelu, key=k) for k in keys[:2]]

    def fn(x):
        for ln, mlp in zip(lns, mlps):
            x = x + jax.vmap(mlp)(jax.vmap(ln)(x))
        return x

    x = jax.random.normal(keys[2], (16, d), jnp.float32)
    return fn, x


def test_vmapped_mlps_keep_each_gemm_with_its_epilogue():
    fn, x = _mlp_blocks(32, 64, 16)
    part = lax_ir.partition(lax_ir.capture(fn, x))
    gemms = [r for r in part.regions if "matmul" in r.program.op_counts()]
    assert len(gemms) == 4, part.explain()
    for r in gemms:
        counts = r.program.op_counts()
        assert "transpose" not in counts and not blockers(r.program), r.program
        (m,) = [n for n in r.program.nodes if n.op == "matmul"]
        assert r.program.nodes[m.args[0]].shape[0] == 16, r.program  # rows @ [K, N]
        # the up-projection's bias and GELU are its epilogue, not the next GEMM's prologue
        if "tanh" in counts:
            assert r.program.nodes[m.args[1]].shape[1] == 64, r.program
    assert sum("tanh" in r.program.op_counts() for r in gemms) == 2
    (got,) = run_partition(part, [x])
    np.testing.assert_allclose(np.asarray(got), np.asarray(fn(x)), rtol=1e-5, atol=1e-5)


def test_a_vmapped_projection_with_its_residual_is_one_row_major_region():
    """Decode over a batch (rows = batch): `x + W @ h` per sequence, vmapped."""
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(1), 3)
    lin = eqx.nn.Linear(32, 32, use_bias=False, key=k1)

    def fn(x, h):
        return jax.vmap(lambda x, h: x + lin(h))(x, h)

    x = jax.random.normal(k2, (8, 1, 32), jnp.float32)[:, 0]
    h = jax.random.normal(k3, (8, 32), jnp.float32)
    part = lax_ir.partition(lax_ir.capture(fn, x, h))
    (r,) = part.regions
    assert set(r.program.op_counts()) <= {"matmul", "add"}, r.program
    assert r.program.output_avals[0][0] == (8, 32), r.program
    (got,) = run_partition(part, [x, h])
    np.testing.assert_allclose(np.asarray(got), np.asarray(fn(x, h)), rtol=1e-5, atol=1e-5)
