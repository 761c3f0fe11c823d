"""The real-model benchmark set: decoder blocks as flax nnx, equinox and plain-jnp users write them.

Where `experiments.benchmarks` holds the paper's hand-shaped programs, this registry holds
blocks in the form real model code has (library modules, einsums, rotary embeddings, KV caches
written with `dynamic_update_slice`, masks through `jnp.where`, float32 softmax):

| name | what | written in |
| --- | --- | --- |
| llama_decode_nnx | Llama decode step: RMSNorm, GQA + RoPE over a KV cache, SwiGLU | flax nnx |
| llama_decode_eqx | the same function | equinox |
| gemma_decode | Gemma (v1) decode step: (1 + w) RMSNorm, GQA, erf-GELU gated MLP | jax.numpy |
| gpt2_prefill | GPT-2 block over T tokens: LayerNorm, fused qkv, causal MHA, tanh-GELU | jax.numpy |
| sdpa, sdpa_causal | `jax.nn.dot_product_attention` (xla), GQA, T = S, without/with causal mask | jax.nn |
| sdpa_decode | the same, one query token over S keys | jax.nn |

Usage::

    m = models.get("llama_decode_nnx", batch=1, size="tiny")
    case = m.make(seed=0)                     # args, and the checkpoint and inputs behind them
    outs = jax.jit(m.fn)(*case.args)          # (x, k_cache, v_cache)
    want = m.reference(case)                  # float64 numpy, same weights
    program = lax_ir.capture(m.fn, *m.abstract_args())   # no weights drawn
    cudnn = m.with_attention("cudnn")         # the same block, attention by cuDNN (GPU)

`attention=` picks what computes each block's attention core (`experiments.models.attention`:
"einsum", the model as written, by default; "xla", "cudnn", "pallas_decode", "tokamax_*").

Sizes are in `experiments.models.configs` ("tiny", "realistic", "llama7b"). Tiny runs in float32
by default, the others in float16 (the dtype of the paper's set on the GPU); `dtype=` overrides.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from experiments.models import attention as attn
from experiments.models import checkpoints as ck
from experiments.models import configs, reference
from experiments.models.configs import SIZES, Config

BATCHES = (1, 8)
"""The batch sizes the suite lists (any batch >= 1 is accepted by `get`)."""
H100_BANDWIDTH = 3.0e12
"""Approximate H100 copy bandwidth in bytes/s, as in `experiments.benchmarks`."""
TOLERANCE = {"float32": (2e-4, 2e-4), "bfloat16": (5e-2, 5e-2), "float16": (1e-2, 1e-2)}
"""(rtol, atol) against the float64 reference, by model dtype."""
CACHE_OUTPUTS = ("k_cache", "v_cache")


@dataclass(frozen=True)
class Case:
    """One drawn instance of a model: `fn(*args)`, and the checkpoint and inputs behind `args`.

    `weights` is the checkpoint dict the library pytree (`args[0]`) was loaded from ({} for the
    attention-only entries); `inputs` holds the remaining arguments by name, as numpy arrays.
    """

    args: tuple[Any, ...]
    weights: ck.Weights
    inputs: dict[str, np.ndarray]


@dataclass(frozen=True)
class _Entry:
    family: str
    library: str
    make_fn: Callable[[Config], Callable[..., Any]]
    input_shapes: Callable[[Config, int], dict[str, tuple[int, ...]]]
    reference: Callable[[Config, ck.Weights, Mapping[str, np.ndarray]], Any]
    output_names: tuple[str, ...]
    notes: str
    weight_specs: Callable[[Config], ck.WeightSpecs] | None = None
    weight_stream: int = 0
    load: Callable[[Config, ck.Weights, Any], Any] | None = None
    params_name: str = "params"
    adjust: Callable[[Config], Config] = lambda c: c


@dataclass(frozen=True)
class Model:
    """One model of the set at one size, batch and dtype.

    Arguments:
        name: registry name, e.g. "llama_decode_nnx".
        size: "tiny", "realistic" or "llama7b" (`experiments.models.configs`).
        batch: the batch size B.
        dtype: dtype of weights and activations (`pos` is int32).
        config: the shape hyper-parameters.
        library: "flax.nnx", "equinox", "jax.numpy" or "jax.nn".
        fn: the jittable function; `fn(*case.args)` returns the outputs, in `output_names` order.
        arg_names: one name per positional argument ("block"/"params" is the weights pytree).
        output_names: one name per output.
        notes: what the block is and where it departs from the model it follows.
        attention: what computes the attention core (`experiments.models.attention`).
    """

    name: str
    size: str
    batch: int
    dtype: np.dtype
    config: Config
    library: str
    fn: Callable[..., Any]
    arg_names: tuple[str, ...]
    output_names: tuple[str, ...]
    notes: str
    _entry: _Entry = field(repr=False, compare=False)
    attention: str = attn.DEFAULT

    @property
    def key(self) -> str:
        """f"{name}_{size}_b{batch}", and f"_{dtype}" where that is not the size's default."""
        own = "" if self.dtype == default_dtype(self.size) else f"_{self.dtype.name}"
        return f"{self.name}_{self.size}_b{self.batch}{own}"

    @property
    def tolerance(self) -> tuple[float, float]:
        """(rtol, atol) of outputs against `reference`, for this dtype."""
        return TOLERANCE[self.dtype.name]

    def not_applicable(self, attention: str) -> str | None:
        """Why `attention` cannot compute this block's attention core, or None."""
        c = self.config
        return attn.not_applicable(
            attention, family=self._entry.family, q_len=c.q_len, kv_len=c.kv_len,
            head_dim=c.head_dim, dtype=self.dtype,
        )  # fmt: skip

    def with_attention(self, attention: str) -> Model:
        """This model with its attention core computed by `attention`; ValueError saying why
        where that implementation does not apply."""
        reason = self.not_applicable(attention)
        if reason is not None:
            raise ValueError(f"{self.key}: attention={attention!r} does not apply: {reason}")
        fn = attn.with_attention(self._entry.make_fn(self.config), attention)
        return dataclasses.replace(self, fn=fn, attention=attention)

    def _input_shapes(self) -> dict[str, tuple[int, ...]]:
        return self._entry.input_shapes(self.config, self.batch)

    def make(self, seed: int = 0) -> Case:
        """Draw the checkpoint and inputs from `seed` and load the weights into the library."""
        e = self._entry
        weights: ck.Weights = {}
        args: list[Any] = []
        if e.weight_specs is not None and e.load is not None:
            weights = ck.draw(e.weight_specs(self.config), seed, e.weight_stream, self.dtype)
            args.append(e.load(self.config, weights, self.dtype))
        inputs = ck.draw_inputs(self._input_shapes(), self.config, seed, self.dtype)
        args.extend(jnp.asarray(v) for v in inputs.values())
        return Case(tuple(args), weights, inputs)

    def abstract_args(self) -> tuple[Any, ...]:
        """The arguments as `jax.ShapeDtypeStruct`s (the weights pytree with abstract leaves).

        Nothing is drawn, so this is cheap at every size; `lax_ir.capture` and `jax.eval_shape`
        take these.
        """
        e = self._entry
        args: list[Any] = []
        if e.weight_specs is not None and e.load is not None:
            specs = {
                n: jax.ShapeDtypeStruct(shape, self.dtype)
                for n, (shape, _, _) in e.weight_specs(self.config).items()
            }
            args.append(jax.eval_shape(lambda w: e.load(self.config, w, self.dtype), specs))
        for n, shape in self._input_shapes().items():
            args.append(jax.ShapeDtypeStruct(shape, ck.input_dtype(n, self.dtype)))
        return tuple(args)

    def output_specs(self) -> tuple[jax.ShapeDtypeStruct, ...]:
        """Shapes and dtypes of the outputs."""
        out = jax.eval_shape(self.fn, *self.abstract_args())
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def reference(self, case: Case) -> tuple[np.ndarray, ...]:
        """The float64 numpy outputs for `case` (written apart from the JAX code)."""
        out = self._entry.reference(self.config, case.weights, case.inputs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def floor_bytes(self, in_place_cache: bool = False) -> int:
        """Bytes moved if every input (weights, KV cache, activations) is read once and every
        output written once, as `experiments.benchmarks` defines floors.

        `in_place_cache=True`: an updated KV cache output counts only the q_len rows written
        (what a decode step with donated, aliased caches must write); the caches are still read
        whole, since attention reads them.
        """
        total = sum(
            int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
            for leaf in jax.tree_util.tree_leaves(self.abstract_args())
        )
        c = self.config
        for name, spec in zip(self.output_names, self.output_specs()):
            if in_place_cache and name in CACHE_OUTPUTS:
                rows = self.batch * c.q_len * c.kv_heads * c.head_dim
                total += rows * np.dtype(spec.dtype).itemsize
            else:
                total += int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize
        return total

    def floor_us(
        self, bandwidth_bytes_per_s: float = H100_BANDWIDTH, in_place_cache: bool = False
    ) -> float:
        """Time floor in µs: `floor_bytes` at the given copy bandwidth."""
        return self.floor_bytes(in_place_cache) / bandwidth_bytes_per_s * 1e6


# ---- the registry ----------------------------------------------------------------------------


def _llama_nnx(cfg: Config) -> Callable[..., Any]:
    from experiments.models.llama_nnx import llama_decode_nnx

    return llama_decode_nnx


def _llama_nnx_load(cfg: Config, w: ck.Weights, dtype: Any) -> Any:
    from experiments.models import llama_nnx

    return llama_nnx.from_weights(cfg, w, dtype)


def _llama_eqx(cfg: Config) -> Callable[..., Any]:
    from experiments.models.llama_eqx import llama_decode_eqx

    return llama_decode_eqx


def _llama_eqx_load(cfg: Config, w: ck.Weights, dtype: Any) -> Any:
    from experiments.models import llama_eqx

    return llama_eqx.from_weights(cfg, w, dtype)


def _gemma(cfg: Config) -> Callable[..., Any]:
    from experiments.models.gemma import gemma_decode

    return gemma_decode


def _gemma_load(cfg: Config, w: ck.Weights, dtype: Any) -> Any:
    from experiments.models import gemma

    return gemma.from_weights(cfg, w, dtype)


def _gpt2(cfg: Config) -> Callable[..., Any]:
    from experiments.models.gpt2 import make_gpt2_prefill

    return make_gpt2_prefill(cfg)


def _gpt2_load(cfg: Config, w: ck.Weights, dtype: Any) -> Any:
    from experiments.models import gpt2

    return gpt2.from_weights(cfg, w, dtype)


def _sdpa_fn(causal: bool) -> Callable[[Config], Callable[..., Any]]:
    def make(cfg: Config) -> Callable[..., Any]:
        from experiments.models import sdpa

        return sdpa.sdpa_causal if causal else sdpa.sdpa

    return make


_DECODE_OUT = ("x", "k_cache", "v_cache")
_LLAMA_NOTES = (
    "Llama decode step (q_len 1): RMSNorm with gain (eps 1e-5), q/k/v projections, split-half "
    "RoPE at pos (theta 1e4), cache written at pos by dynamic_update_slice, GQA, mask "
    "jnp.where(mask, s, finfo.min), float32 softmax, o-projection, residual; RMSNorm, SwiGLU, "
    "residual. "
)
_ENTRIES: dict[str, _Entry] = {
    "llama_decode_nnx": _Entry(
        family="decode",
        library="flax.nnx",
        make_fn=_llama_nnx,
        input_shapes=ck.decode_input_shapes,
        reference=lambda c, w, i: reference.llama_decode(w, i),
        output_names=_DECODE_OUT,
        notes=_LLAMA_NOTES + "nnx.Linear/nnx.RMSNorm, repeat_kv GQA, einsum attention.",
        weight_specs=ck.llama_weight_specs,
        weight_stream=0,
        load=_llama_nnx_load,
        params_name="block",
    ),
    "llama_decode_eqx": _Entry(
        family="decode",
        library="equinox",
        make_fn=_llama_eqx,
        input_shapes=ck.decode_input_shapes,
        reference=lambda c, w, i: reference.llama_decode(w, i),
        output_names=_DECODE_OUT,
        notes=_LLAMA_NOTES + "eqx.nn.Linear/eqx.nn.RMSNorm on one example, vmapped over "
        "tokens and batch; attention vmapped over KV heads. Same weights, same function as "
        "llama_decode_nnx.",
        weight_specs=ck.llama_weight_specs,
        weight_stream=0,
        load=_llama_eqx_load,
        params_name="block",
    ),
    "gemma_decode": _Entry(
        family="decode",
        library="jax.numpy",
        make_fn=_gemma,
        input_shapes=ck.decode_input_shapes,
        reference=lambda c, w, i: reference.gemma_decode(w, i),
        output_names=_DECODE_OUT,
        notes="Gemma v1 decode step (q_len 1) on a params dict: (1 + w) RMSNorm without float32 "
        "upcast (eps 1e-6), einsums in Gemma's layouts, RoPE, queries scaled by H**-0.5, GQA "
        "by query-head grouping, mask value -2.38e38, softmax in the model dtype; GELU-gated "
        "MLP with the exact erf GELU (Gemma itself uses tanh). Sizes as the Llama entries "
        "(Gemma's own have head dim 256).",
        weight_specs=ck.gemma_weight_specs,
        weight_stream=1,
        load=_gemma_load,
    ),
    "gpt2_prefill": _Entry(
        family="gpt2",
        library="jax.numpy",
        make_fn=_gpt2,
        input_shapes=ck.prefill_input_shapes,
        reference=lambda c, w, i: reference.gpt2_prefill(w, i, c.q_heads),
        output_names=("x", "k", "v"),
        notes="GPT-2 block, prefill of T = q_len tokens on a nested params dict: LayerNorm "
        "(gain, bias, eps 1e-5), fused qkv with bias, causal MHA on (B, T, heads, hd) with "
        "mask -inf, tanh-GELU MLP, residuals; also returns k and v (the prefill's cache "
        "entries). realistic = gpt2-medium at 512 tokens, llama7b = gpt2-xl at 1024.",
        weight_specs=ck.gpt2_weight_specs,
        weight_stream=2,
        load=_gpt2_load,
    ),
    "sdpa": _Entry(
        family="sdpa",
        library="jax.nn",
        make_fn=_sdpa_fn(False),
        input_shapes=ck.attention_input_shapes,
        reference=lambda c, w, i: reference.dot_product_attention(i, causal=False),
        output_names=("out",),
        notes="jax.nn.dot_product_attention(q, k, v, implementation='xla'), GQA, T = S.",
    ),
    "sdpa_causal": _Entry(
        family="sdpa",
        library="jax.nn",
        make_fn=_sdpa_fn(True),
        input_shapes=ck.attention_input_shapes,
        reference=lambda c, w, i: reference.dot_product_attention(i, causal=True),
        output_names=("out",),
        notes="jax.nn.dot_product_attention(..., is_causal=True, implementation='xla'), GQA, "
        "T = S.",
    ),
    "sdpa_decode": _Entry(
        family="sdpa",
        library="jax.nn",
        make_fn=_sdpa_fn(False),
        input_shapes=ck.attention_input_shapes,
        reference=lambda c, w, i: reference.dot_product_attention(i, causal=False),
        output_names=("out",),
        notes="jax.nn.dot_product_attention(q, k, v, implementation='xla') for one query "
        "token (T = 1) over S keys, GQA: the attention of a decode step.",
        adjust=lambda c: c.replace(q_len=1),
    ),
}


def names() -> list[str]:
    """The model names in the registry."""
    return list(_ENTRIES)


def default_dtype(size: str) -> np.dtype:
    """float32 for "tiny" (CPU tests), float16 for the realistic sizes."""
    return np.dtype(np.float32 if size == "tiny" else np.float16)


def get(
    name: str, batch: int = 1, size: str = "tiny", dtype: Any = None, attention: str = attn.DEFAULT
) -> Model:
    """The model `name` at `batch` and `size` (its attention by `attention`); KeyError/ValueError
    naming the valid choices."""
    if name not in _ENTRIES:
        raise KeyError(f"no model {name!r}; names: {', '.join(names())}")
    if size not in SIZES:
        raise KeyError(f"no size {size!r}; sizes: {', '.join(SIZES)}")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    e = _ENTRIES[name]
    cfg = e.adjust(configs.config(e.family, size))
    dt = default_dtype(size) if dtype is None else np.dtype(dtype)
    if dt.name not in TOLERANCE:
        raise ValueError(f"dtype {dt.name} not supported; one of {', '.join(TOLERANCE)}")
    input_names = tuple(e.input_shapes(cfg, batch))
    arg_names = ((e.params_name,) if e.weight_specs is not None else ()) + input_names
    model = Model(
        name=name,
        size=size,
        batch=batch,
        dtype=dt,
        config=cfg,
        library=e.library,
        fn=e.make_fn(cfg),
        arg_names=arg_names,
        output_names=e.output_names,
        notes=e.notes,
        _entry=e,
    )
    return model if attention == attn.DEFAULT else model.with_attention(attention)


def suite(size: str = "realistic", batches: tuple[int, ...] = BATCHES) -> list[Model]:
    """Every model at `size` and each of `batches`."""
    return [get(n, b, size) for n in names() for b in batches]


__all__ = [
    "BATCHES",
    "SIZES",
    "Case",
    "Config",
    "Model",
    "default_dtype",
    "get",
    "names",
    "suite",
]
