"""Model code the project's own tests do not contain, written as users write it: a Qwen2-style
prefill block in plain jnp (biased q/k/v, GQA, RoPE, causal softmax, SwiGLU, bfloat16), a flax
linen pre-LN MLP block with GELU, `jax.nn.dot_product_attention` with a causal mask,
Llama-style MLP layers stacked and run by `jax.lax.scan` (on a CPU at small sizes), and a
decode step whose q/k/v and gate/up weights are each one array, its product cut by `jnp.split`
(Phi-3's fused layout), writing its KV cache, a flax linen Llama-style block (`RMSNorm`,
`SelfAttention`, SwiGLU) over a batch of sequences, T5's ReLU feed-forward layer, and an MLP's
training step (`jax.value_and_grad` and an SGD update). Each runs under `mirage_jax.jit` (fresh cache, its
own search) and is compared to `jax.jit`; the regions' decisions are printed. Small shapes: a
check of reach and correctness, not a timing.

    python -m experiments.unseen_models                    # on the GPU: default backend
    python -m experiments.unseen_models --backend pallas-interpret qwen fused   # on a CPU
"""

import argparse
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import mirage_jax


def rms(x, w, eps=1e-6):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + eps)).astype(x.dtype) * w


def rope(x, pos, theta=10000.0):
    d = x.shape[-1]
    inv = 1.0 / theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d)
    ang = pos[:, None].astype(jnp.float32) * inv[None]
    cos, sin = jnp.cos(ang)[None, :, None], jnp.sin(ang)[None, :, None]
    x1, x2 = x[..., : d // 2].astype(jnp.float32), x[..., d // 2 :].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


def qwen_block(p, x, pos):
    """Qwen2-style prefill: biased q/k/v, GQA 4/2 heads, RoPE, causal softmax, SwiGLU; bf16."""
    B, T, D = x.shape
    H, KV, hd = 4, 2, D // 4
    h = rms(x, p["ln1"])
    q = (h @ p["wq"] + p["bq"]).reshape(B, T, H, hd)
    k = (h @ p["wk"] + p["bk"]).reshape(B, T, KV, hd)
    v = (h @ p["wv"] + p["bv"]).reshape(B, T, KV, hd)
    q, k = rope(q, pos), rope(k, pos)
    k = jnp.repeat(k, H // KV, axis=2)
    v = jnp.repeat(v, H // KV, axis=2)
    s = jnp.einsum("bthd,bshd->bhts", q, k).astype(jnp.float32) / np.sqrt(hd)
    mask = jnp.tril(jnp.ones((T, T), bool))
    s = jnp.where(mask, s, -1e30)
    a = jax.nn.softmax(s, axis=-1).astype(x.dtype)
    o = jnp.einsum("bhts,bshd->bthd", a, v).reshape(B, T, D)
    x = x + o @ p["wo"]
    h = rms(x, p["ln2"])
    return x + (jax.nn.silu(h @ p["wg"]) * (h @ p["wu"])) @ p["wd"]


def qwen_params(D=64, F=128, dtype=jnp.bfloat16):
    rng = np.random.default_rng(0)

    def n(*s):
        return jnp.asarray(rng.standard_normal(s) * 0.05, dtype)

    return {
        "ln1": jnp.ones(D, dtype),
        "ln2": jnp.ones(D, dtype),
        "wq": n(D, D),
        "bq": n(D),
        "wk": n(D, D // 2),
        "bk": n(D // 2),
        "wv": n(D, D // 2),
        "bv": n(D // 2),
        "wo": n(D, D),
        "wg": n(D, F),
        "wu": n(D, F),
        "wd": n(F, D),
    }


def linen_block():
    import flax.linen as nn

    class MLPBlock(nn.Module):
        dim: int = 64

        @nn.compact
        def __call__(self, x):
            h = nn.LayerNorm()(x)
            h = nn.Dense(4 * self.dim)(h)
            h = nn.gelu(h)
            h = nn.Dense(self.dim)(h)
            return x + h

    m = MLPBlock()
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 8, 64)), jnp.float32)
    params = m.init(jax.random.PRNGKey(0), x)
    return (lambda params, x: m.apply(params, x)), (params, x)


def linen_rms_block(batch=2, tokens=8, d=64, heads=4):
    """flax linen, Llama-style: `RMSNorm`, `SelfAttention` (causal, no biases), a SwiGLU MLP of
    `Dense` layers, over a batch of sequences (the norms' rows merged before their
    projections)."""
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.RMSNorm()(x)
            attn = nn.SelfAttention(num_heads=heads, use_bias=False)
            x = x + attn(h, mask=nn.make_causal_mask(x[..., 0]))
            h = nn.RMSNorm()(x)
            gate, up = nn.Dense(4 * d, use_bias=False)(h), nn.Dense(4 * d, use_bias=False)(h)
            return x + nn.Dense(d, use_bias=False)(nn.silu(gate) * up)

    m = Block()
    x = jnp.asarray(np.random.default_rng(5).standard_normal((batch, tokens, d)), jnp.float32)
    return m.apply, (m.init(jax.random.PRNGKey(0), x), x)


def relu_ffn(batch=2, tokens=8, d=64):
    """T5's feed-forward layer in flax linen: an RMS norm, `Dense` without biases, ReLU, and
    the residual add."""
    import flax.linen as nn

    class FFN(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.Dense(4 * d, use_bias=False)(nn.RMSNorm()(x))
            return x + nn.Dense(d, use_bias=False)(nn.relu(h))

    m = FFN()
    x = jnp.asarray(np.random.default_rng(7).standard_normal((batch, tokens, d)), jnp.float32)
    return m.apply, (m.init(jax.random.PRNGKey(0), x), x)


def train_step(batch=2, tokens=8, d=64):
    """One SGD step of a two-layer MLP: the loss, `jax.value_and_grad`, the update (the
    weight gradients `gᵀ h` and the loss's mean over (B, T, D))."""

    def step(params, x):
        def loss(p):
            h = jax.nn.relu(x @ p["w1"] + p["b1"]) @ p["w2"]
            return jnp.mean(h**2)

        value, grads = jax.value_and_grad(loss)(params)
        return value, jax.tree.map(lambda a, g: a - 0.1 * g, params, grads)

    rng = np.random.default_rng(6)

    def n(*s):
        return jnp.asarray(rng.standard_normal(s) * 0.1, jnp.float32)

    return step, ({"w1": n(d, 4 * d), "b1": n(4 * d), "w2": n(4 * d, d)}, n(batch, tokens, d))


def sdpa_prefill():
    def f(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True)

    rng = np.random.default_rng(2)

    def mk():
        return jnp.asarray(rng.standard_normal((2, 16, 4, 32)) * 0.5, jnp.float32)

    return f, (mk(), mk(), mk())


def softcap_attention(batch=2, tokens=16, heads=4, head_dim=32, cap=50.0):
    """Gemma-2's attention: the scores soft-capped, `cap·tanh(s/cap)`, then the causal mask and
    the softmax; bf16."""

    def f(q, k, v):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * head_dim**-0.5
        s = jnp.tanh(s / cap) * cap
        s = jnp.where(jnp.tril(jnp.ones((tokens, tokens), bool)), s, -jnp.inf)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1).astype(v.dtype), v)

    rng = np.random.default_rng(8)

    def mk():
        x = rng.standard_normal((batch, tokens, heads, head_dim)) * 2.0
        return jnp.asarray(x, jnp.bfloat16)

    return f, (mk(), mk(), mk())


def scanned_stack(layers=4, D=1024, F=2816, dtype=jnp.float16):
    """Llama-style MLP layers (RMSNorm, SwiGLU, residual) stacked and run by `jax.lax.scan`."""

    def layer(x, w):
        h = rms(x, w["ln"])
        return x + (jax.nn.silu(h @ w["wg"]) * (h @ w["wu"])) @ w["wd"], None

    def model(x, ws):
        return jax.lax.scan(layer, x, ws)[0]

    rng = np.random.default_rng(4)

    def n(*s):
        return jnp.asarray(rng.standard_normal(s) * 0.02, dtype)

    ws = {"ln": jnp.ones((layers, D), dtype), "wg": n(layers, D, F), "wu": n(layers, D, F),
          "wd": n(layers, F, D)}  # fmt: skip
    return model, (n(1, D) * 50, ws)


def fused_decode(batch=2, heads=4, kv_heads=2, head_dim=16, ffn=128, cache=32):
    """One decode step, fused weights: `x @ wqkv` split into q/k/v, `x @ wgu` into gate and up
    (`jnp.split`), the new K/V row written at `pos` (`dynamic_update_slice`), a `where` mask
    over the cache, GQA, SwiGLU; float16."""
    d = heads * head_dim

    def block(p, x, kc, vc, pos):
        b = x.shape[0]
        h = rms(x, p["ln1"])
        q, k, v = jnp.split(h @ p["wqkv"], [d, d + kv_heads * head_dim], axis=-1)
        k, v = k.reshape(b, 1, kv_heads, head_dim), v.reshape(b, 1, kv_heads, head_dim)
        kc = jax.lax.dynamic_update_slice(kc, k, (0, pos, 0, 0))
        vc = jax.lax.dynamic_update_slice(vc, v, (0, pos, 0, 0))
        qg = q.reshape(b, kv_heads, heads // kv_heads, head_dim)
        s = jnp.einsum("bkgd,bskd->bkgs", qg, kc) / np.sqrt(head_dim)
        s = jnp.where((jnp.arange(cache) <= pos)[None, None, None], s, -1e9)
        a = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(x.dtype)
        x = x + jnp.einsum("bkgs,bskd->bkgd", a, vc).reshape(b, d) @ p["wo"]
        g, u = jnp.split(rms(x, p["ln2"]) @ p["wgu"], 2, axis=-1)
        return x + (jax.nn.silu(g) * u) @ p["wd"], kc, vc

    rng = np.random.default_rng(5)

    def n(*s):
        return jnp.asarray(rng.standard_normal(s) * 0.1, jnp.float16)

    p = {"ln1": jnp.ones((d,), jnp.float16), "ln2": jnp.ones((d,), jnp.float16),
         "wqkv": n(d, (heads + 2 * kv_heads) * head_dim), "wo": n(d, d), "wgu": n(d, 2 * ffn),
         "wd": n(ffn, d)}  # fmt: skip
    kv = (batch, cache, kv_heads, head_dim)
    return block, (p, n(batch, d), n(*kv), n(*kv), jnp.int32(5))


def run(name, fn, args, backend=None):
    """`fn(*args)` under mirage_jax.jit against jax.jit: prints (and returns) the first call's
    seconds, the largest error relative to each output's magnitude, and the decisions."""
    opts = {} if backend is None else {"backend": backend}
    with tempfile.TemporaryDirectory() as d:
        f = mirage_jax.jit(fn, cache=Path(d) / "c.sqlite", **opts)
        t0 = time.perf_counter()
        got = f(*args)
        t = time.perf_counter() - t0
        want = jax.jit(fn)(*args)
        g, w = jax.tree.leaves(got), jax.tree.leaves(want)
        err = max(
            float(
                jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))
                / (float(jnp.max(jnp.abs(b.astype(jnp.float32)))) + 1e-30)
            )
            for a, b in zip(g, w)
        )
        rec = f.last
        print(
            f"{name}: {t:.1f}s err {err:.2e} decisions:",
            [(d.index, d.status, d.reason[:60]) for d in rec.decisions],
            flush=True,
        )
        for body in f.scan_bodies:
            print(
                f"  {body.last.name}:",
                [(d.index, d.status, d.reason[:60]) for d in body.last.decisions],
            )
        return t, err, rec.decisions


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "models",
        nargs="*",
        default=[
            "qwen",
            "linen",
            "linen_rms",
            "relu_ffn",
            "sdpa",
            "scan",
            "fused",
            "train",
            "softcap",
        ],
    )
    p.add_argument("--backend", default=None, help="mirage_jax.jit's backend (default: its own)")
    args = p.parse_args(argv)
    if "qwen" in args.models:
        x = jnp.asarray(np.random.default_rng(3).standard_normal((1, 8, 64)), jnp.bfloat16)
        run("qwen", qwen_block, (qwen_params(), x, jnp.arange(8)), args.backend)
    if "linen" in args.models:
        fn, xs = linen_block()
        run("linen", fn, xs, args.backend)
    if "sdpa" in args.models:
        fn, xs = sdpa_prefill()
        run("sdpa", fn, xs, args.backend)
    if "scan" in args.models:
        fn, xs = scanned_stack() if args.backend is None else scanned_stack(2, 64, 128)
        run("scan", fn, xs, args.backend)
    if "fused" in args.models:
        fn, xs = fused_decode()
        run("fused", fn, xs, args.backend)
    for name, make in (
        ("linen_rms", linen_rms_block),
        ("relu_ffn", relu_ffn),
        ("train", train_step),
        ("softcap", softcap_attention),
    ):
        if name in args.models:
            fn, xs = make()
            run(name, fn, xs, args.backend)


if __name__ == "__main__":
    main()
