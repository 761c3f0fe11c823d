"""Model code written as users write it, not in `experiments.models`: under `mirage_jax.jit` on
the CPU (Pallas interpret mode) its results match `jax.jit`'s."""

from experiments.unseen_models import fused_decode, run


def test_a_decode_step_with_fused_weights_gets_kernels_and_jax_jits_values():
    """q/k/v and gate/up each one weight, their products cut by `jnp.split`, the KV cache
    written at `pos`: the norms' projections, the attention and the down projection reach the
    search, and every output (the new row and both caches) matches jax.jit in float16."""
    fn, args = fused_decode()
    _, err, decisions = run("fused", fn, args, "pallas-interpret")
    assert err < 2e-2
    kernels = [d for d in decisions if d.status == "kernel"]
    assert len(kernels) >= 4, [(d.index, d.status, d.reason) for d in decisions]
