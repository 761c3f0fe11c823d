"""Generated Triton source on disk and at run time: the source cache, loading a kernel from it,
launching it (jax-triton, or Triton's interpreter on host arrays for CPU tests)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pathlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from mirage_jax.lower.registry import LoweringError

_MODULES: dict[str, Any] = {}


def cache_dir() -> pathlib.Path:
    """Where generated sources live: $MIRAGE_JAX_TRITON_CACHE, else the user cache dir."""
    env = os.environ.get("MIRAGE_JAX_TRITON_CACHE")
    if env:
        return pathlib.Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "mirage_jax" / "triton"


def load_kernel(name: str, source: str) -> Any:
    """Write `source` to the cache (once) and import its `@triton.jit` function `name`."""
    key = hashlib.sha256(source.encode()).hexdigest()
    if key in _MODULES:
        return getattr(_MODULES[key], name)
    path = cache_dir() / f"{name}_{key[:8]}.py"
    if not path.exists() or path.read_text() != source:
        path.parent.mkdir(parents=True, exist_ok=True)
        # per process and thread: `select` compiles candidates in threads, and two of them
        # can generate the same source
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(f"mirage_jax_triton_{key[:16]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _MODULES[key] = module
    return getattr(module, name)


# ---------------------------------------------------------------------------- on the CPU
class _HostPointer:
    """A numpy array as Triton's interpreter sees a device tensor (a pointer and a dtype)."""

    def __init__(self, array: np.ndarray):
        self.array = array

    def data_ptr(self) -> int:
        return self.array.ctypes.data

    @property
    def dtype(self) -> str:
        return f"torch.{self.array.dtype.name}"


def _interpretable_stdlib(scope: Any) -> None:
    """Patch triton.language for the interpreter, restorably (`scope.restore()` undoes it).

    Triton decorates its standard library (tl.sum, tl.sigmoid, ...) at import; without
    TRITON_INTERPRET=1 set before that, those are compiled-only JITFunctions. They are swapped
    for interpreted ones that do not re-patch the language on each call (Triton's own
    InterpretedFunction does, and never undoes it, which breaks later compilation in the same
    process). The reduction combiners stay: the interpreter recognises them by identity.
    """
    import triton.language as tl
    from triton.runtime import interpreter as ti
    from triton.runtime.jit import JITFunction

    class Interpreted(ti.InterpretedFunction):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return self.rewrite()(*args, **kwargs)

    namespace = {"tl": tl, "core": tl.core}
    exec("def _uses_tl_and_core(): pass", namespace)
    inner = ti._patch_lang(namespace["_uses_tl_and_core"])
    scope._changes.extend(inner._changes)
    std = tl.standard
    keep = {
        id(getattr(std, n))
        for n in dir(std)
        if n.startswith("_") and ("combine" in n or n.startswith("_elementwise_"))
    }
    for mod in (tl, std, tl.math, tl.core):
        for name, member in list(vars(mod).items()):
            if isinstance(member, JITFunction) and id(member) not in keep:
                scope.set_attr(mod, name, Interpreted(member.fn))
    # a scalar loaded at run time (a loop bound) holds one element, not a 0-d array: numpy 2
    # refuses int() of it, which the interpreter's `range` needs
    scope.set_attr(tl.core.tensor, "__index__", lambda self: int(np.ravel(self.handle.data)[0]))


def interpret_kernel(fn: Any, grid: tuple[int, ...], *arrays: np.ndarray, **constants: Any) -> None:
    """Run a `@triton.jit` kernel on host numpy arrays in Triton's interpreter (CPU only),
    with `constants` for its `tl.constexpr` arguments."""
    from triton.runtime import interpreter as ti

    raw = fn.fn if hasattr(fn, "fn") else fn
    rewritten = ti.InterpretedFunction(raw).rewrite()
    args = [ti._implicit_cvt(_HostPointer(a)) for a in arrays]  # imports gluon: before patching
    scope = ti._patch_lang(raw)
    _interpretable_stdlib(scope)
    try:
        grid3 = (*grid, *(1,) * (3 - len(grid)))
        ti.interpreter_builder.set_grid_dim(*grid3)
        for x in range(grid3[0]):
            for y in range(grid3[1]):
                for z in range(grid3[2]):
                    ti.interpreter_builder.set_grid_idx(x, y, z)
                    rewritten(*args, **constants)
    finally:
        scope.restore()


def _unwritten(dtype: Any) -> Any:
    """What an output holds before the interpreted kernel writes it: NaN, or an integer's
    least value."""
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.inexact):
        return np.nan
    return np.iinfo(dtype).min if np.issubdtype(dtype, np.integer) else 0


def launcher(
    name: str,
    source: str,
    out_shape: list[jax.ShapeDtypeStruct],
    grid: tuple[int, ...],
    num_warps: int,
    stages: int,
    interpret: bool,
    where: str,
) -> Callable[..., list[jax.Array]]:
    """A function of a generated kernel's inputs launching it over `grid` with `num_warps`
    warps and `stages` pipelining stages (jax-triton on a GPU; Triton's interpreter through
    `jax.pure_callback` with `interpret`), its outputs `out_shape`; with a vmap rule
    (`sequential_batching`)."""
    try:
        fn = load_kernel(name, source)
    except ImportError as e:
        raise LoweringError(
            f"{where}: the triton backend needs the `triton` package: {e}"
        ) from None
    if interpret:

        def host(*xs: np.ndarray) -> list[np.ndarray]:
            ins = [np.ascontiguousarray(np.asarray(x)) for x in xs]
            outs = [np.full(o.shape, _unwritten(o.dtype), o.dtype) for o in out_shape]
            interpret_kernel(fn, grid, *ins, *outs)
            return outs

        def kernel(*xs: jax.Array) -> list[jax.Array]:
            return list(jax.pure_callback(host, out_shape, *xs))

        return sequential_batching(kernel)
    try:
        import jax_triton as jt
    except ImportError as e:
        raise LoweringError(
            f"{where}: the triton backend needs jax-triton 0.3.1 (with triton 3.6) on a GPU: {e}"
        ) from None

    def kernel(*xs: jax.Array) -> list[jax.Array]:
        return list(
            jt.triton_call(
                *xs,
                kernel=fn,
                out_shape=out_shape,
                grid=grid,
                num_warps=num_warps,
                num_stages=stages,
                name=name,
            )
        )

    return sequential_batching(kernel)  # jax-triton's custom call has no batching rule


def sequential_batching(kernel: Callable[..., Sequence[jax.Array]]) -> Callable[..., list]:
    """`kernel` with a vmap rule that runs it once per batch element (`lax.map`).

    For kernels whose primitive cannot be batched (jax-triton's `triton_call`): under `vmap`
    the kernel still runs, element by element, over the batched arguments; the unbatched ones
    are closed over, not broadcast.
    """

    @jax.custom_batching.custom_vmap
    def call(*xs: jax.Array) -> tuple[jax.Array, ...]:
        return tuple(kernel(*xs))

    @call.def_vmap
    def rule(axis_size: int, in_batched: Sequence[bool], *xs: jax.Array):
        batched = tuple(x for x, b in zip(xs, in_batched) if b)

        def one(row: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
            it = iter(row)
            return call(*[next(it) if b else x for x, b in zip(xs, in_batched)])

        outs = jax.lax.map(one, batched)
        return outs, tuple(True for _ in outs)

    return lambda *xs: list(call(*xs))


def compile_for(source_fn: Any, dtypes: list[str], config: Any = None, cc: int = 90) -> Any:
    """Compile a generated kernel for CUDA compute capability `cc` without a GPU (CPU check),
    with `config`'s warps and stages (a `TritonConfig`; default 4 and 3).

    Returns Triton's compiled kernel (its `.asm` has ttir/ttgir/ptx/cubin, `.metadata.shared`
    the shared memory in bytes); raises the compiler's error otherwise.
    """
    import triton
    from triton.backends.compiler import GPUTarget

    sig = {a: f"*{_TRITON_TY[dt]}" for a, dt in zip(source_fn.arg_names, dtypes)}
    # jax-triton specializes every array argument as 16-byte aligned; without that hint the
    # loads are not vectorized and the loop is not pipelined (no cp.async)
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(sig))}
    src = triton.compiler.ASTSource(fn=source_fn, signature=sig, constexprs={}, attrs=attrs)
    options = {
        "num_warps": getattr(config, "num_warps", 4),
        "num_stages": getattr(config, "num_stages", 3),
    }
    return triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)


_TRITON_TY = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
