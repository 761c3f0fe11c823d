"""Forms of a non-donated KV-cache write, timed on the GPU (the probe behind `copy_update`).

A decode step without donation returns updated copies of its caches. XLA writes them as a
copy per cache and an in-place update. This probe times that against one `select` per cache
(the copy with the new rows in it, `jnp.where` over the position axis), alone and, as a decode
block has it, with a rotary embedding on the new k rows and on q beside them; the select forms
with the rows behind an optimization barrier (`barrier`) or stacked in one operand (`shared`).
Every form is checked against the first (to 1e-3: the rope's rounding may differ with its
fusion). Device time by `profile.time_trace` (median of 30
calls), with each kernel's time.

    python -m experiments.cache_write_forms
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

if not __package__:  # python experiments/X.py: see experiments/_path.py
    import _path  # noqa: F401

from mirage_jax import profile

SHAPES = [(1, 512, 2, 128, 8), (8, 512, 2, 128, 8), (1, 4096, 8, 128, 32), (8, 4096, 8, 128, 32)]
"""(batch, cache length, KV heads, head dim, query heads): realistic and Llama-7B decode."""


def rope(x: jax.Array, pos: jax.Array) -> jax.Array:
    """The rotary embedding at position `pos` (rotate-half form)."""
    h = x.shape[-1]
    angle = pos.astype(jnp.float32) / (10000.0 ** (jnp.arange(0, h, 2, dtype=jnp.float32) / h))
    cos, sin = jnp.tile(jnp.cos(angle), 2), jnp.tile(jnp.sin(angle), 2)
    rotated = jnp.concatenate([-x[..., h // 2 :], x[..., : h // 2]], -1)
    return (x * cos + rotated * sin).astype(x.dtype)


def select_update(cache: jax.Array, rows: jax.Array, pos: jax.Array) -> jax.Array:
    """`dynamic_update_slice(cache, rows, (0, pos, 0, 0))` as one select over the copy."""
    n = cache.shape[1]
    at = jnp.clip(jnp.where(pos < 0, pos + n, pos), 0, n - 1)  # as lax's: wrapped, then clipped
    hit = lax.broadcasted_iota(jnp.int32, cache.shape, 1) == at
    return jnp.where(hit, jnp.broadcast_to(rows, cache.shape), cache)


def form(name: str, roped: bool):
    """The cache write `name` (dus, select, barrier, shared), with or without the rope."""

    def f(k_cache, v_cache, q, k, v, pos):
        if roped:
            q, k = rope(q, pos), rope(k, pos)
        if name == "barrier":
            k, v = lax.optimization_barrier((k, v))
        if name == "shared":
            both = lax.optimization_barrier(jnp.stack([k, v]))
            k, v = both[0], both[1]
        if name == "dus":
            starts = (0, pos, 0, 0)
            caches = (
                lax.dynamic_update_slice(k_cache, k, starts),
                lax.dynamic_update_slice(v_cache, v, starts),
            )
        else:
            caches = select_update(k_cache, k, pos), select_update(v_cache, v, pos)
        return (q, *caches) if roped else caches

    return f


def main() -> None:
    print(
        f"{jax.devices()[0].device_kind}, jax {jax.__version__}; profile.time_trace, median of 30"
    )
    for b, s, kv, h, qh in SHAPES:

        def inputs(seed: int, b=b, s=s, kv=kv, h=h, qh=qh) -> tuple:
            keys = jax.random.split(jax.random.key(seed), 5)
            shapes = [(b, s, kv, h), (b, s, kv, h), (b, 1, qh, h), (b, 1, kv, h), (b, 1, kv, h)]
            arrays = [jax.random.normal(k, sh, jnp.float16) for k, sh in zip(keys, shapes)]
            return (*arrays, jnp.int32(s // 2 + seed))

        mb = 2 * b * s * kv * h * 2 / 1e6
        for roped in (False, True):
            print(f"caches {(b, s, kv, h)} float16, {mb:.1f} MB in all, rope {roped}", flush=True)
            want = jax.jit(form("dus", roped))(*inputs(0))
            for name in ("dus", "select", "barrier", "shared"):
                fn = jax.jit(form(name, roped))
                same = all(  # the rope's rounding may differ with its fusion
                    np.allclose(np.asarray(a, np.float32), np.asarray(w, np.float32), 1e-3, 1e-3)
                    for a, w in zip(fn(*inputs(0)), want)
                )
                t = profile.time_trace(fn, inputs, calls=30)
                kernels = ", ".join(f"{n[:26]} {us:.2f}" for n, us, _ in t.kernels)
                print(f"   {name:8s} {t.median_us:7.2f} µs  matches={same}  {kernels}", flush=True)


if __name__ == "__main__":
    main()
