"""Which implementation computes the real models' attention core: the switch and its kernels.

The blocks of `experiments.models` compute attention as their authors wrote it ("einsum": the
einsums, masks and softmax of each port; for the `sdpa*` entries, their
`jax.nn.dot_product_attention(implementation="xla")` call). For the baselines of
`experiments.real_baselines` the same block can hand its attention core (after the RoPE, the
cache write and any query scaling; before the output projection) to a library kernel instead:

| name | what computes softmax(q kᵀ · scale + mask) v |
| --- | --- |
| einsum | the model's own code (the default; its trace is unchanged) |
| xla | `jax.nn.dot_product_attention(implementation="xla")` (runs anywhere: the CPU stand-in) |
| cudnn | `jax.nn.dot_product_attention(implementation="cudnn")` (float16/bfloat16, GPU) |
| pallas_decode | `jax.experimental.pallas.ops.gpu.decode_attention.gqa` (one query token; interpret mode off the GPU) |
| tokamax_mosaic, tokamax_triton | `tokamax.dot_product_attention(implementation=...)` |

Layouts are jax.nn's: q (B, T, N, H), k and v (B, S, K, H), query head n served by KV head
n // (N // K) (grouped-query attention without repeating K and V). A decode step's mask
(cache slots 0..pos visible) is a valid length per sequence, `pos + 1`; GPT-2's causal mask is
`causal=True`.

The choice is read while the model is traced: `use(name)` sets it for the code inside, and
`with_attention(fn, name)` returns `fn` itself for "einsum" and otherwise a wrapper that traces
`fn` under `use(name)` (so `jax.jit(with_attention(fn, "cudnn"))` is the cuDNN variant).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

IMPLEMENTATIONS = ("einsum", "xla", "cudnn", "pallas_decode", "tokamax_mosaic", "tokamax_triton")
"""The attention implementations a model can be built with ("einsum": as written)."""
DEFAULT = "einsum"

_current: contextvars.ContextVar[str] = contextvars.ContextVar("attention", default=DEFAULT)


def current() -> str:
    """The implementation the model code being traced should use."""
    return _current.get()


@contextlib.contextmanager
def use(name: str) -> Iterator[None]:
    """Trace the models' attention with `name` inside this block."""
    check_name(name)
    token = _current.set(name)
    try:
        yield
    finally:
        _current.reset(token)


def check_name(name: str) -> None:
    """KeyError naming the choices unless `name` is one of `IMPLEMENTATIONS`."""
    if name not in IMPLEMENTATIONS:
        raise KeyError(f"no attention implementation {name!r}; one of {', '.join(IMPLEMENTATIONS)}")


def with_attention(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """`fn` with its attention computed by `name` (`fn` itself for the default)."""
    check_name(name)
    if name == DEFAULT:
        return fn

    @functools.wraps(fn)
    def traced_with(*args: Any, **kwargs: Any) -> Any:
        with use(name):
            return fn(*args, **kwargs)

    traced_with.__qualname__ = f"{getattr(fn, '__qualname__', 'fn')}[attention={name}]"
    return traced_with


def not_applicable(
    name: str, *, family: str, q_len: int, kv_len: int, head_dim: int, dtype: Any
) -> str | None:
    """Why `name` cannot compute this model's attention, or None where it can."""
    check_name(name)
    dt = np.dtype(dtype)
    if family == "decode" and name != DEFAULT and q_len != 1:
        return (
            f"the switch covers decode steps of one token (a valid-length mask); this block "
            f"attends {q_len} new tokens at an offset, a bottom-right causal mask"
        )
    if name == "cudnn":
        if dt.name not in ("float16", "bfloat16"):
            return f"cuDNN attention takes float16/bfloat16 inputs; this model runs in {dt.name}"
        if head_dim % 8 or head_dim > 256:
            return f"cuDNN attention needs a head dim that is a multiple of 8, <= 256: {head_dim}"
    if name == "pallas_decode":
        if q_len != 1:
            return (
                f"Pallas decode_attention attends one query token per sequence (a decode step); "
                f"this model attends {q_len} query tokens (a prefill)"
            )
        if kv_len < 16:
            return f"Pallas decode_attention needs at least 16 keys per split: {kv_len} keys"
    return None


def decode_lengths(pos: jax.Array, batch: int) -> jax.Array:
    """(B,) int32 valid key counts of a one-token decode step at `pos`: slots 0..pos."""
    return jnp.broadcast_to(jnp.asarray(pos, jnp.int32) + 1, (batch,))


def _on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def _pallas_decode(
    q: jax.Array, k: jax.Array, v: jax.Array, valid_len: jax.Array | None, scale: float
) -> jax.Array:
    import importlib
    import warnings

    with warnings.catch_warnings():  # deprecated upstream; still the reference decode kernel
        warnings.simplefilter("ignore", DeprecationWarning)
        decode_attention = importlib.import_module(
            "jax.experimental.pallas.ops.gpu.decode_attention"
        )
    s = k.shape[1]
    block_k = min(128, s)
    k_splits = max(1, min(16, s // block_k))
    while k_splits > 1 and (s % k_splits or s // k_splits < 16):  # the kernel's constraints
        k_splits -= 1
    out = decode_attention.gqa(
        q[:, 0], k, v, kv_seq_len=valid_len, sm_scale=scale, block_k=block_k,
        k_splits=k_splits, interpret=not _on_gpu(),
    )  # fmt: skip
    return out[:, None]


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    valid_len: jax.Array | None = None,
    causal: bool = False,
    scale: float | None = None,
    name: str | None = None,
) -> jax.Array:
    """softmax(q kᵀ · scale + mask) v by `name` (default: `current()`), q (B, T, N, H).

    Arguments:
        q: queries (B, T, N, H); k, v: keys and values (B, S, K, H), N a multiple of K.
        valid_len: (B,) int32; keys at or past it are masked (None: all keys).
        causal: query t sees keys 0..t (jax.nn's top-left alignment).
        scale: the logits' scale (default 1/sqrt(H)).
        name: one of `IMPLEMENTATIONS` other than "einsum" (the model's own code).
    """
    name = current() if name is None else name
    check_name(name)
    scale = 1.0 / float(np.sqrt(q.shape[-1])) if scale is None else float(scale)
    if name in ("xla", "cudnn"):
        return jax.nn.dot_product_attention(
            q, k, v, scale=scale, is_causal=causal, key_value_seq_lengths=valid_len,
            implementation=name,
        )  # fmt: skip
    if name == "pallas_decode":
        if q.shape[1] != 1 or causal:
            raise NotImplementedError("Pallas decode_attention: one query token, no causal mask")
        return _pallas_decode(q, k, v, valid_len, scale)
    if name.startswith("tokamax_"):
        tk = import_tokamax()
        return tk.dot_product_attention(
            q, k, v, scale=scale, is_causal=causal, key_value_seq_lengths=valid_len,
            implementation=name.removeprefix("tokamax_"),
        )  # fmt: skip
    raise ValueError(f"attend() computes the library implementations, not {name!r}")


def import_tokamax() -> Any:
    """tokamax, or raise ImportError; its benchmarking module's xprof import is stubbed."""
    if importlib.util.find_spec("tokamax") is None:
        raise ImportError("tokamax is not installed")
    if importlib.util.find_spec("xprof") is None:  # used only by tokamax.benchmarking
        from importlib.machinery import ModuleSpec

        for name in ("xprof", "xprof.cli", "xprof.cli.tools"):
            if name not in sys.modules:
                spec = ModuleSpec(name, None, is_package=name != "xprof.cli.tools")
                sys.modules[name] = importlib.util.module_from_spec(spec)
        sys.modules["xprof.cli.tools"].get_kernel_stats_tool = None  # type: ignore[attr-defined]
    import tokamax

    try:  # its autotuning cache misses are logged as warnings, one per shape: not news here
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:
        pass
    return tokamax
