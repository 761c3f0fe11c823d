"""Model code written as users write it, not in `experiments.models`: under `mirage_jax.jit` on
the CPU (Pallas interpret mode) its results match `jax.jit`'s."""

from experiments.unseen_models import fused_decode, linen_rms_block, run, softcap_attention


def test_a_decode_step_with_fused_weights_gets_kernels_and_jax_jits_values():
    """q/k/v and gate/up each one weight, their products cut by `jnp.split`, the KV cache
    written at `pos`: the norms' projections, the attention and the down projection reach the
    search, and every output (the new row and both caches) matches jax.jit in float16."""
    fn, args = fused_decode()
    _, err, decisions = run("fused", fn, args, "pallas-interpret")
    assert err < 2e-2
    kernels = [d for d in decisions if d.status == "kernel"]
    assert len(kernels) >= 4, [(d.index, d.status, d.reason) for d in decisions]


def test_a_linen_llama_block_over_a_batch_of_sequences_gets_kernels():
    """flax linen's `RMSNorm` before `Dense` and `SelfAttention` at batch 2: the norms' rows
    are merged before their projections (`lax_ir.row_layouts`), so the norm + q/k/v, the
    attention, the output projection and the MLP reach the search; outputs match jax.jit."""
    fn, args = linen_rms_block()
    _, err, decisions = run("linen_rms", fn, args, "pallas-interpret")
    assert err < 1e-4
    kernels = [d for d in decisions if d.status == "kernel"]
    assert len(kernels) >= 4, [(d.index, d.status, d.reason) for d in decisions]


def test_gemma2_soft_capped_attention_gets_a_kernel():
    """`50·tanh(s/50)` before the causal mask and softmax (Gemma-2): one kernel, jax.jit's
    values to bfloat16's precision (jax.jit itself is 1.7e-2 from the float32 function, 2.1e-2
    from the kernel)."""
    fn, args = softcap_attention()
    _, err, decisions = run("softcap", fn, args, "pallas-interpret")
    assert err < 5e-2
    assert any(d.status == "kernel" for d in decisions), [
        (d.index, d.status, d.reason) for d in decisions
    ]
