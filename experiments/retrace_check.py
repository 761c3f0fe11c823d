"""Does a second `mirage_jax.jit` call trace again? Three calls in a fresh process per mode.

For `_env.settle_trace_context` (a module imported during the first trace that registers a JAX
trace-context state changes `jax.jit`'s cache key): "settled" runs the shipped code,
"unsettled" empties `_env.TRACE_CONTEXT_MODULES`. Prints each call's wall time, the trace
count and the trace context's size before the first call and after each:

    python -m experiments.retrace_check
"""

from __future__ import annotations

import subprocess
import sys
import time


def run(mode: str) -> None:
    """gqa_stable at b=1 under `mirage_jax.jit` (default options), called three times."""
    import jax

    import mirage_jax
    import mirage_jax._env as env
    from experiments import benchmarks

    if mode == "unsettled":
        env.TRACE_CONTEXT_MODULES = ()
    bm = benchmarks.get("gqa_stable", 1)
    xs = [jax.numpy.asarray(a) for a in bm.make_inputs(0)]
    f = mirage_jax.jit(bm.fn)
    before = env.trace_context_size()
    for i in range(3):
        t = time.perf_counter()
        jax.block_until_ready(f(*xs))
        after = env.trace_context_size()
        print(
            f"{mode} call {i}: {time.perf_counter() - t:.3f} s, traces {f.stats.traces}, "
            f"context {before} -> {after}",
            flush=True,
        )


if __name__ == "__main__":
    if sys.argv[1:] in (["settled"], ["unsettled"]):
        run(sys.argv[1])
    elif len(sys.argv) > 1:
        sys.exit(__doc__)
    else:
        for m in ("settled", "unsettled"):
            subprocess.run([sys.executable, "-m", "experiments.retrace_check", m], check=False)
