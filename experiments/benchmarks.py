"""The paper's benchmark programs as plain JAX functions, with inputs and floors.

Each `Benchmark` is one program at one batch size: a plain JAX function of positional arrays,
its input specs (fp16), a float64 numpy reference, and the floor in bytes (inputs read once,
output written once). Programs are written once and are shape-agnostic; shapes come from a
per-workload rule over a dims dict, so full and reduced (`small()`) shapes share one definition.

Two forms per workload:
- form "ours": the program as this project states it (eps = 1e-6, QKNorm on Q and K with 0.125 scaling,
  LoRA and GatedMLP rows scaling with b), plus the attention variants `gqa_scaled`, `gqa_stable`.
- form "mirage" (`<workload>_mirage`): what the original's saved µGraphs compute, at the shapes of
  their checkpoints (`CHECKPOINT_FILES`), so imported µGraphs compare directly. Its rms_norm has
  no eps (its transpiler lowers rms as sqrt(mean(x²)), then divides), its attention is unscaled
  with no max shift, its QKNorm normalises Q and V over their last dim, K untouched.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

EPS = 1e-6
"""rms_norm epsilon of our forms; the original's rms_norm has none."""
ATTN_SCALE = 0.125
"""1/sqrt(64), the attention scaling the original omits."""
H100_BANDWIDTH = 3.0e12
"""Approximate H100 copy bandwidth in bytes/s (reads + writes), for `floor_us`."""
BATCHES = (1, 8, 16)
PAPER_NAMES = ("gqa", "gqa_scaled", "qknorm", "rmsnorm", "lora", "gated_mlp", "ntrans")
SMALL_INPUTS = ("Q", "K")
"""Inputs drawn from N(0,1)·0.25 instead of N(0,1)."""

Shape = tuple[int, ...]
ShapeRule = Callable[[Mapping[str, int]], tuple[tuple[Shape, ...], Shape]]


# ---- programs (JAX) --------------------------------------------------------------------------


def rms_norm(x: jax.Array, eps: float = EPS, axis: int = -1) -> jax.Array:
    """x / sqrt(mean(x*x, axis) + eps), no learned weight."""
    return x / jnp.sqrt(jnp.mean(x * x, axis=axis, keepdims=True) + eps)


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, scale: float | None) -> jax.Array:
    s = q @ k if scale is None else (q @ k) * scale
    e = jnp.exp(s)
    return (e / jnp.sum(e, axis=-1, keepdims=True)) @ v


def gqa(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Unscaled attention with no max shift, as in the original: (E / sum E) @ V, E = exp(QK)."""
    return _attend(q, k, v, None)


def gqa_scaled(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """`gqa` on (Q @ K) * 0.125."""
    return _attend(q, k, v, ATTN_SCALE)


def gqa_stable(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """softmax((Q @ K) * 0.125) @ V with the max subtraction of real attention code."""
    return jax.nn.softmax((q @ k) * ATTN_SCALE, axis=-1) @ v


def qknorm(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """rms_norm Q over its head dim (last) and K over its head dim (axis 1), then `gqa_scaled`."""
    return _attend(rms_norm(q), rms_norm(k, axis=-2), v, ATTN_SCALE)


def qknorm_mirage(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """The original's QKNorm: Q and V normalised over their last dim, no eps, unscaled."""
    return _attend(rms_norm(q, eps=0.0), k, rms_norm(v, eps=0.0), None)


def rmsnorm(x: jax.Array, w: jax.Array) -> jax.Array:
    """rms_norm(X) @ W."""
    return rms_norm(x) @ w


def rmsnorm_mirage(x: jax.Array, w: jax.Array) -> jax.Array:
    """rms_norm(X) @ W without eps, as the original."""
    return rms_norm(x, eps=0.0) @ w


def lora(x: jax.Array, w: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """X @ W + (X @ A) @ B."""
    return x @ w + (x @ a) @ b


def gated_mlp(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    """silu(X @ W1) * (X @ W2)."""
    return jax.nn.silu(x @ w1) * (x @ w2)


def ntrans(h: jax.Array, x: jax.Array, alpha: jax.Array) -> jax.Array:
    """rms_norm(X + alpha * (rms_norm(H) + X)), the nGPT residual update."""
    return rms_norm(x + alpha * (rms_norm(h) + x))


def ntrans_mirage(h: jax.Array, x: jax.Array, alpha: jax.Array) -> jax.Array:
    """`ntrans` without eps, as the original."""
    return rms_norm(x + alpha * (rms_norm(h, eps=0.0) + x), eps=0.0)


# ---- float64 references (numpy) --------------------------------------------------------------


def _f64(*arrays: Any) -> list[np.ndarray]:
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def _np_rms_norm(x: np.ndarray, eps: float = EPS, axis: int = -1) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=axis, keepdims=True) + eps)


def _np_attend(q, k, v, scale: float | None, shift: bool = False) -> np.ndarray:
    s = np.matmul(q, k) * (1.0 if scale is None else scale)
    if shift:
        s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return np.matmul(e / e.sum(axis=-1, keepdims=True), v)


def gqa_reference(q, k, v) -> np.ndarray:
    return _np_attend(*_f64(q, k, v), None)


def gqa_scaled_reference(q, k, v) -> np.ndarray:
    return _np_attend(*_f64(q, k, v), ATTN_SCALE)


def gqa_stable_reference(q, k, v) -> np.ndarray:
    return _np_attend(*_f64(q, k, v), ATTN_SCALE, shift=True)


def qknorm_reference(q, k, v) -> np.ndarray:
    q, k, v = _f64(q, k, v)
    return _np_attend(_np_rms_norm(q), _np_rms_norm(k, axis=-2), v, ATTN_SCALE)


def qknorm_mirage_reference(q, k, v) -> np.ndarray:
    q, k, v = _f64(q, k, v)
    return _np_attend(_np_rms_norm(q, 0.0), k, _np_rms_norm(v, 0.0), None)


def rmsnorm_reference(x, w, eps: float = EPS) -> np.ndarray:
    x, w = _f64(x, w)
    return _np_rms_norm(x, eps) @ w


def rmsnorm_mirage_reference(x, w) -> np.ndarray:
    return rmsnorm_reference(x, w, eps=0.0)


def lora_reference(x, w, a, b) -> np.ndarray:
    x, w, a, b = _f64(x, w, a, b)
    return x @ w + (x @ a) @ b


def gated_mlp_reference(x, w1, w2) -> np.ndarray:
    x, w1, w2 = _f64(x, w1, w2)
    g = x @ w1
    return g / (1.0 + np.exp(-g)) * (x @ w2)


def ntrans_reference(h, x, alpha, eps: float = EPS) -> np.ndarray:
    h, x, alpha = _f64(h, x, alpha)
    return _np_rms_norm(x + alpha * (_np_rms_norm(h, eps) + x), eps)


def ntrans_mirage_reference(h, x, alpha) -> np.ndarray:
    return ntrans_reference(h, x, alpha, eps=0.0)


# ---- shape rules: dims dict -> (input shapes, output shape) ----------------------------------


def _attention_shapes(d: Mapping[str, int]) -> tuple[tuple[Shape, ...], Shape]:
    h, lq, hd, kv = d["heads"], d["q_len"], d["head_dim"], d["kv_len"]
    return ((h, lq, hd), (h, hd, kv), (h, kv, hd)), (h, lq, hd)


def _rmsnorm_shapes(d: Mapping[str, int]) -> tuple[tuple[Shape, ...], Shape]:
    return ((d["rows"], d["hidden"]), (d["hidden"], d["out"])), (d["rows"], d["out"])


def _lora_shapes(d: Mapping[str, int]) -> tuple[tuple[Shape, ...], Shape]:
    m, k, n, r = d["rows"], d["hidden"], d["out"], d["rank"]
    return ((m, k), (k, n), (k, r), (r, n)), (m, n)


def _gated_mlp_shapes(d: Mapping[str, int]) -> tuple[tuple[Shape, ...], Shape]:
    m, k, n = d["rows"], d["hidden"], d["ffn"]
    return ((m, k), (k, n), (k, n)), (m, n)


def _ntrans_shapes(d: Mapping[str, int]) -> tuple[tuple[Shape, ...], Shape]:
    return ((d["rows"], d["hidden"]),) * 3, (d["rows"], d["hidden"])


def _attention_dims(b: int) -> dict[str, int]:
    return {"heads": 2 * b, "q_len": 256, "head_dim": 64, "kv_len": 4096}


# ---- the benchmark record --------------------------------------------------------------------


@dataclass(frozen=True)
class Benchmark:
    """One benchmark program at one batch size.

    Arguments:
        name: program name, e.g. "rmsnorm", "gqa_scaled", "qknorm_mirage".
        batch: the batch size b.
        fn: plain JAX function of positional arrays returning one array.
        inputs: input specs (fp16 by default).
        input_names: one name per input, e.g. ("X", "W").
        reference: pure-numpy float64 function of the same positional inputs.
        floor_bytes: each input read once plus the output written once, at the benchmark dtype.
        notes: where shapes or forms differ from the original, and why.
        form: "ours" (this project's statement) or "mirage" (the original system's own form).
        workload: the base workload, e.g. "gqa" for "gqa_scaled".
        dims: the named sizes the shapes are built from.
        output: the output spec.
        checkpoint: the original's µGraph file for this form and batch ("" if none).
    """

    name: str
    batch: int
    fn: Callable[..., jax.Array]
    inputs: tuple[jax.ShapeDtypeStruct, ...]
    input_names: tuple[str, ...]
    reference: Callable[..., np.ndarray]
    floor_bytes: int
    notes: str
    form: str
    workload: str
    dims: tuple[tuple[str, int], ...] = ()
    output: jax.ShapeDtypeStruct | None = None
    checkpoint: str = ""
    shape_rule: ShapeRule | None = field(default=None, repr=False, compare=False)

    @property
    def key(self) -> str:
        """Registry key, f"{name}_b{batch}"."""
        return f"{self.name}_b{self.batch}"

    @property
    def dtype(self) -> np.dtype:
        """The benchmark dtype (that of the inputs)."""
        return np.dtype(self.inputs[0].dtype)

    def resized(self, dims: Mapping[str, int]) -> Benchmark:
        """The same program with some named dims replaced (inputs, output and floor follow)."""
        unknown = set(dims) - {k for k, _ in self.dims}
        if unknown:
            raise KeyError(f"{self.key} has no dims {sorted(unknown)}; it has {dict(self.dims)}")
        assert self.shape_rule is not None
        return dataclasses.replace(
            self, **_shaped(self.shape_rule, {**dict(self.dims), **dims}, self.dtype)
        )

    def small(self, divisor: int = 16, min_dim: int = 16) -> Benchmark:
        """The same program at reduced shapes for CPU tests.

        Each dim above `min_dim` is divided by `divisor` (but not below `min_dim`), so the full
        shapes' multiples of 256 stay multiples of 16; dims at or below `min_dim` are kept.
        """
        return self.resized(
            {k: v if v <= min_dim else max(min_dim, v // divisor) for k, v in self.dims}
        )

    def make_inputs(
        self, seed: int, dtype: Any = None, scale_shapes: Mapping[str, int] | None = None
    ) -> list[np.ndarray]:
        """Random inputs: Q and K from N(0,1)·0.25, the rest N(0,1), cast to `dtype`.

        Arguments:
            seed: deterministic seed; input i is drawn from its own stream (seed, i).
            dtype: defaults to the benchmark dtype (fp16).
            scale_shapes: named dims to replace (see `resized`), e.g. {"kv_len": 256}.
        """
        if scale_shapes:
            return self.resized(scale_shapes).make_inputs(seed, dtype)
        dt = self.dtype if dtype is None else np.dtype(dtype)
        arrays = []
        for i, (name, spec) in enumerate(zip(self.input_names, self.inputs)):
            x = np.random.default_rng([seed, i]).standard_normal(spec.shape)
            arrays.append((x * (0.25 if name in SMALL_INPUTS else 1.0)).astype(dt))
        return arrays

    def floor_us(self, bandwidth_bytes_per_s: float = H100_BANDWIDTH) -> float:
        """Time floor in µs: `floor_bytes` at the given copy bandwidth."""
        return self.floor_bytes / bandwidth_bytes_per_s * 1e6


def _shaped(rule: ShapeRule, dims: Mapping[str, int], dtype: Any) -> dict[str, Any]:
    """The shape-dependent fields of a Benchmark: dims, inputs, output, floor_bytes."""
    in_shapes, out_shape = rule(dims)
    dt = np.dtype(dtype)
    elements = sum(math.prod(s) for s in in_shapes) + math.prod(out_shape)
    return {
        "dims": tuple(dims.items()),
        "inputs": tuple(jax.ShapeDtypeStruct(s, dt) for s in in_shapes),
        "output": jax.ShapeDtypeStruct(out_shape, dt),
        "floor_bytes": elements * dt.itemsize,
    }


# ---- the registry ----------------------------------------------------------------------------

CHECKPOINT_FILES = {
    "gqa": "gqa_bs{b}.json",
    "qknorm": "qknorm_gqa_bs{b}.json",
    "rmsnorm": "rmsnorm_bs{b}.json",
    "lora": "lora_bs{b}.json",
    "gated_mlp": "gated_mlp_bs{b}.json",
    "ntrans": "norm_transformer_bs{b}.json",
}
"""The original's µGraph file per workload, under peer/mirage_mugraphs/{a100,h100}/."""

# workload: (shape rule, input names, dims of our form at batch b)
_WORKLOADS: dict[str, tuple[ShapeRule, tuple[str, ...], Callable[[int], dict[str, int]]]] = {
    "gqa": (_attention_shapes, ("Q", "K", "V"), _attention_dims),
    "qknorm": (_attention_shapes, ("Q", "K", "V"), _attention_dims),
    "rmsnorm": (
        _rmsnorm_shapes,
        ("X", "W"),
        lambda b: {"rows": 2 * b, "hidden": 4096, "out": 6144},
    ),
    "lora": (
        _lora_shapes,
        ("X", "W", "A", "B"),
        lambda b: {"rows": 16 * b, "hidden": 256, "out": 4096, "rank": 16},
    ),
    "gated_mlp": (
        _gated_mlp_shapes,
        ("X", "W1", "W2"),
        lambda b: {"rows": 8 * b, "hidden": 4096, "ffn": 4096},
    ),
    "ntrans": (_ntrans_shapes, ("H", "X", "alpha"), lambda b: {"rows": b, "hidden": 4096}),
}
_MIRAGE_ROWS = {"lora": 16, "gated_mlp": 8}
"""Rows the original fixes at every batch size (its scripts and checkpoints ignore b)."""

# name: (workload, form, fn, reference)
_PROGRAMS: dict[str, tuple[str, str, Callable[..., jax.Array], Callable[..., np.ndarray]]] = {
    "gqa": ("gqa", "ours", gqa, gqa_reference),
    "gqa_scaled": ("gqa", "ours", gqa_scaled, gqa_scaled_reference),
    "gqa_stable": ("gqa", "ours", gqa_stable, gqa_stable_reference),
    "qknorm": ("qknorm", "ours", qknorm, qknorm_reference),
    "rmsnorm": ("rmsnorm", "ours", rmsnorm, rmsnorm_reference),
    "lora": ("lora", "ours", lora, lora_reference),
    "gated_mlp": ("gated_mlp", "ours", gated_mlp, gated_mlp_reference),
    "ntrans": ("ntrans", "ours", ntrans, ntrans_reference),
    "gqa_mirage": ("gqa", "mirage", gqa, gqa_reference),
    "qknorm_mirage": ("qknorm", "mirage", qknorm_mirage, qknorm_mirage_reference),
    "rmsnorm_mirage": ("rmsnorm", "mirage", rmsnorm_mirage, rmsnorm_mirage_reference),
    "lora_mirage": ("lora", "mirage", lora, lora_reference),
    "gated_mlp_mirage": ("gated_mlp", "mirage", gated_mlp, gated_mlp_reference),
    "ntrans_mirage": ("ntrans", "mirage", ntrans_mirage, ntrans_mirage_reference),
}

_NO_EPS = "The original's rms_norm has no eps (it lowers rms as sqrt(mean(x²)), then divides)."
_FIXED_ROWS = "X fixed at {r} rows at every batch, as the original's scripts and checkpoints."
_NOTES = {
    "gqa": "The original's program and shapes: unscaled, no max shift, so on unscaled data its "
    "exp can overflow fp16.",
    "gqa_scaled": "Beyond the original: S = (Q @ K) * 0.125, the real 1/sqrt(64); no max shift.",
    "gqa_stable": "Beyond the original: jax.nn.softmax((Q @ K) * 0.125) with max subtraction; "
    "a µGraph for it needs online softmax.",
    "qknorm": "Corrected: normalises Q and K (the original: Q and V) and scales by 0.125; "
    "exp of normalised Q·K (variance 64) overflows fp16 unscaled.",
    "rmsnorm": "W is 4096x6144 as the graph declares (the original timed a 4096x4096 W).",
    "lora": "X has 16b rows; the original fixes 16 rows (shapes agree at b=1).",
    "gated_mlp": "X has 8b rows; the original fixes 8 rows (shapes agree at b=1). "
    "silu = x*logistic(x), as the original's tb_silu_op.",
    "ntrans": "Shapes as the original; eps 1e-6 (the original has none).",
    "gqa_mirage": "Same program and shapes as `gqa`; listed so every checkpoint has a mirage form.",
    "qknorm_mirage": "The original's form, only to check its µGraphs: rms_norm (no eps) of Q and "
    "of V over their last dim (64), K untouched, unscaled, no max shift. On the standard "
    "draws its sum of exp can exceed the fp16 maximum (7.2e4 seen at b=16).",
    "rmsnorm_mirage": _NO_EPS,
    "lora_mirage": _FIXED_ROWS.format(r=16),
    "gated_mlp_mirage": _FIXED_ROWS.format(r=8),
    "ntrans_mirage": _NO_EPS + " Checkpoints norm_transformer_bs{b}; ntrans_bs* and *_old are "
    "earlier runs at 8b rows.",
}


def _make(name: str, batch: int) -> Benchmark:
    workload, form, fn, reference = _PROGRAMS[name]
    rule, input_names, dims_of = _WORKLOADS[workload]
    dims = dims_of(batch)
    checkpoint = ""
    if form == "mirage":
        if workload in _MIRAGE_ROWS:
            dims["rows"] = _MIRAGE_ROWS[workload]
        checkpoint = CHECKPOINT_FILES[workload].format(b=batch)
    return Benchmark(
        name=name,
        batch=batch,
        fn=fn,
        input_names=input_names,
        reference=reference,
        notes=_NOTES[name],
        form=form,
        workload=workload,
        checkpoint=checkpoint,
        shape_rule=rule,
        **_shaped(rule, dims, jnp.float16),
    )


BENCHMARKS: dict[str, Benchmark] = {
    bm.key: bm for bm in (_make(n, b) for n in _PROGRAMS for b in BATCHES)
}
"""Every benchmark, keyed by f"{name}_b{batch}"."""


def names() -> list[str]:
    """The benchmark program names in the registry."""
    return list(_PROGRAMS)


def get(name: str, batch: int = 1) -> Benchmark:
    """The benchmark `name` at batch size `batch`; KeyError naming the valid choices."""
    try:
        return BENCHMARKS[f"{name}_b{batch}"]
    except KeyError:
        raise KeyError(
            f"no benchmark {name!r} at batch {batch}; names: {', '.join(names())}; "
            f"batches: {', '.join(map(str, BATCHES))}"
        ) from None


def paper_suite(batches: Sequence[int] = (1, 8)) -> list[Benchmark]:
    """The benchmarks the figures use: the six workloads plus `gqa_scaled`, our forms."""
    return [get(n, b) for n in PAPER_NAMES for b in batches]


def models(size: str = "realistic", batches: Sequence[int] = (1, 8)) -> list[Any]:
    """The real-model set (`experiments.models`): every model at `size` and each batch.

    Kept apart from `names()`/`BENCHMARKS`, which list the paper's programs only. Imported
    lazily: the model set needs flax and equinox (the dev extra), the paper's set does not.
    """
    from experiments import models as model_set

    return model_set.suite(size, tuple(batches))
