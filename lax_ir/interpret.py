"""Interpreting a Program over an Algebra, and the float semantics (jnp or numpy).

`interpret` is the single generic evaluator; `FloatAlgebra` gives Programs their float
meaning (faithful to dtypes with jnp, or everything in float64 with numpy as the reference).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lax_ir.algebra import Algebra
from lax_ir.dtypes import is_float
from lax_ir.ops import OPS

# `program.py` builds on this module (Program.interpret); its classes name annotations only.
Node = Program = Any

NodeHook = Callable[[int, Node, Any], Any]


def eval_node(algebra: Algebra, node: Node, args: Sequence[Any]) -> Any:
    """Apply one normalised node to already-evaluated args."""
    op = node.op
    if op == "constant":
        return algebra.constant(node.param("value").array, node.dtype)
    info = OPS.get(op)
    if info is not None and info.kind == "uninterpreted":
        return algebra.unary(op, args[0])
    if op in ("add", "sub", "mul", "div", "max"):
        return getattr(algebra, op)(args[0], args[1])
    if op in ("neg", "exp"):
        return getattr(algebra, op)(args[0])
    if op == "integer_pow":
        return algebra.integer_pow(args[0], node.param("y"))
    if op == "matmul":
        return algebra.matmul(args[0], args[1], node.dtype)
    if op == "reduce_sum":
        return algebra.reduce_sum(args[0], node.param("axes"))
    if op == "reduce_max":
        if node.param("shift", False):
            return algebra.shift_max(args[0], node.param("axes"))
        return algebra.reduce_max(args[0], node.param("axes"))
    if op == "broadcast_in_dim":
        return algebra.broadcast_in_dim(args[0], node.shape, node.param("broadcast_dimensions"))
    if op == "reshape":
        return algebra.reshape(args[0], node.shape)
    if op == "transpose":
        return algebra.transpose(args[0], node.param("permutation"))
    if op == "concatenate":
        return algebra.concatenate(list(args), node.param("axis"))
    if op == "convert":
        return algebra.convert(args[0], node.dtype)
    if op == "opaque":
        return algebra.opaque(node, args)
    if op == "get":
        return args[0][node.param("index")]
    raise NotImplementedError(f"no semantics for op {op!r}")


def interpret(
    program: Program,
    inputs: Sequence[Any],
    algebra: Algebra,
    *,
    hook: NodeHook | None = None,
) -> list[Any]:
    """Evaluate `program` on positional `inputs` over `algebra`; returns the outputs.

    `hook(index, node, value)` may replace each computed value (used by mutation tests).
    """
    if len(inputs) != len(program.inputs):
        raise TypeError(f"{program!r} takes {len(program.inputs)} inputs, got {len(inputs)}")
    env: list[Any] = [None] * len(program.nodes)
    for pos, nid in enumerate(program.inputs):
        env[nid] = inputs[pos]
    for i, node in program.ops():
        value = eval_node(algebra, node, [env[a] for a in node.args])
        if hook is not None:
            value = hook(i, node, value)
        env[i] = value
    return [env[o] for o in program.outputs]


class FloatAlgebra:
    """Float semantics. `xp` is jax.numpy (traceable, dtype-faithful) or numpy.

    With `dtype="float64"` every value is computed in float64 (the reference semantics);
    with `dtype=None` each node keeps its own dtype, as the captured JAX function did.
    """

    def __init__(self, xp: Any = None, dtype: str | None = None):
        if xp is None:
            import jax.numpy as jnp

            xp = jnp
        self.xp = xp
        self.dtype = dtype
        self.is_numpy = xp is np
        # 16-bit operands multiplied into an fp32 accumulator (`matmul`'s preferred type)
        self.narrow_dot = not self.is_numpy and dtype is None

    def _dt(self, dtype: str) -> Any:
        return self.dtype or dtype

    def constant(self, value: np.ndarray, dtype: str) -> Any:
        return self.xp.asarray(value, dtype=self._dt(dtype))

    def add(self, a, b):
        return a + b

    def sub(self, a, b):
        return a - b

    def mul(self, a, b):
        return a * b

    def div(self, a, b):
        return a / b

    def neg(self, a):
        return -a

    def exp(self, a):
        return self.xp.exp(a)

    def unary(self, name: str, a):
        info = OPS.get(name)
        if info is None or info.kind != "uninterpreted":
            raise NotImplementedError(f"float semantics has no unary op {name!r}")
        return info.numpy(a) if self.is_numpy else info.jax(a)

    def integer_pow(self, a, y: int):
        if self.is_numpy:
            return np.power(a, y) if y >= 0 else 1.0 / np.power(a, -y)
        from jax import lax

        return lax.integer_pow(a, y)

    def max(self, a, b):
        return self.xp.maximum(a, b)

    def matmul(self, a, b, dtype: str):
        if self.is_numpy:
            return np.matmul(a, b)
        import jax.numpy as jnp

        return jnp.matmul(a, b, preferred_element_type=self._dt(dtype))

    def reduce_sum(self, a, axes):
        return self.xp.sum(a, axis=tuple(axes))

    def reduce_max(self, a, axes):
        return self.xp.max(a, axis=tuple(axes))

    def shift_max(self, a, axes):
        """A softmax's stabilising shift: the max, with -inf (a row block masked whole) made
        the most negative finite value, so exp(x − shift) is 0 there and never NaN; kernels
        shift the same way (`lower/pallas.py`, `lower/triton.py`)."""
        m = self.reduce_max(a, axes)
        return self.xp.maximum(m, self.xp.asarray(self.xp.finfo(m.dtype).min, dtype=m.dtype))

    def broadcast_in_dim(self, a, shape, broadcast_dimensions):
        if self.is_numpy:
            expanded = [1] * len(shape)
            for src, dst in enumerate(broadcast_dimensions):
                expanded[dst] = a.shape[src]
            return np.broadcast_to(np.reshape(a, expanded), shape)
        from jax import lax

        return lax.broadcast_in_dim(a, tuple(shape), tuple(broadcast_dimensions))

    def reshape(self, a, shape):
        return self.xp.reshape(a, tuple(shape))

    def transpose(self, a, permutation):
        return self.xp.transpose(a, tuple(permutation))

    def concatenate(self, xs, axis):
        return self.xp.concatenate(list(xs), axis=axis)

    def convert(self, a, dtype):
        if self.dtype is not None:
            return a
        return a.astype(dtype)

    def opaque(self, node: Node, args):
        payload = node.param("payload")
        if self.is_numpy:
            args = [a.astype(np.float32) if a.dtype == np.float64 else a for a in args]
        out = payload.primitive.bind(*args, **payload.params)
        if self.is_numpy:
            out = [np.asarray(o) for o in out] if payload.multiple_results else np.asarray(out)
            if self.dtype is not None and not payload.multiple_results and is_float(out.dtype):
                out = out.astype(self.dtype)
        return tuple(out) if payload.multiple_results else out


def evaluate(program: Program, *inputs: Any) -> list[Any]:
    """Run a Program with jax.numpy on positional array inputs (jittable)."""
    return interpret(program, inputs, FloatAlgebra())


def _widened(inputs: Sequence[Any], xp: Any = np) -> list[Any]:
    """The inputs as `xp` arrays (numpy's or jax.numpy's), floating ones (bfloat16 too) in
    float64: the references' inputs."""
    import jax.numpy as jnp

    out = []
    for x in inputs:
        x = xp.asarray(x)
        out.append(x.astype(xp.float64) if jnp.issubdtype(x.dtype, jnp.floating) else x)
    return out


def evaluate_reference(program: Program, *inputs: Any) -> list[np.ndarray]:
    """Run a Program in float64 numpy: the reference the float checks compare against."""
    return interpret(program, _widened(inputs), FloatAlgebra(np, "float64"))


_ON_DEVICE: dict[str, Any] = {}
"""`evaluate_reference_on_device`'s compiled functions of the last few programs (by hash)."""


def evaluate_reference_on_device(program: Program, *inputs: Any) -> list[np.ndarray]:
    """`evaluate_reference`'s float64 values computed by XLA on JAX's default device (64-bit
    types on for the call, one jit): a large region's reference on a GPU in milliseconds where
    numpy takes seconds (Llama-7B causal attention: 22 s on the GPU machine's CPU, 2026-11-27).
    Raises where this JAX has no `enable_x64` context."""
    import jax
    import jax.numpy as jnp

    with jax.enable_x64(True):
        xs = [jnp.asarray(x) for x in inputs]  # widened on the device: no trip through the host
        key = program.canonical_hash
        fn = _ON_DEVICE.pop(key, None) or jax.jit(
            lambda *a: interpret(program, _widened(a, jnp), FloatAlgebra(jnp, "float64"))
        )
        _ON_DEVICE[key] = fn  # the latest last; pieces of one region share one compile
        while len(_ON_DEVICE) > 4:
            _ON_DEVICE.pop(next(iter(_ON_DEVICE)))
        outs = fn(*xs)
        return _widened(outs)
