"""mirage_jax.search: expression-guided enumeration of verified µGraphs for one Lax region.

    result = search(region_program, budget=Budget(time_s=300), seed=0, workers=2)
    result.best, result.mugraphs, result.stop_reason, result.stats, result.to_json()
    choice = mirage_jax.select.select(result, region_program, backend="pallas")  # GPU: fastest

How it works (modules in pipeline order):

- `dims`: logical dimensions (axes that must share a size) by union-find over the region;
  `shrink` rebuilds the region at small sizes (every dimension shrunk consistently, the n of a
  mean with it); the shrunk program equals the benchmark captured at those shapes.
- `expr`: abstract expressions (`red(k, a·b)` for a matmul over k, ...), the region's outputs
  saturated once in egglog with Mirage's axioms, then dumped into a Python table so each
  candidate op is checked by one dict lookup.
- `vocab`, `enumerate`: block ops from the region's own vocabulary, added depth-first in a
  canonical order; each is checked (labels and shapes, linearity of partial sums, the
  subexpression lookup) before it is built; graphs close when their outputs equal the targets.
- `schedule`, `structure`: a structure is a µGraph without numbers. The enumeration runs once
  per (loop, split-K) class; grid axes over output dimensions are added to each closed graph
  (`grid_expansions`), and numbers (grid sizes, loop ranges) are enumerated at full size.
- `tasks`, `driver`: tasks (one per schedule class) run depth-major with iterative deepening,
  in a process pool if asked; closed graphs are verified on the shrunk representative (grid 2,
  loop 2) with `fields.verify`; accepted structures are instantiated at full size, ranked by
  `cost` and the best are verified again at full size. `cuts` splits a region at matmul
  prologues when nothing is found in one piece.
- `predefined`: the kernel level. Short sequences of pre-defined kernel ops (a GEMM left to
  XLA, and elementwise or reduction ops on its result) in canonical order, each kept only if
  its abstract expression is a subexpression of a target; the rest of the region is searched
  as graph-defined kernel(s) reading the pre-defined outputs (`Budget.max_predefined`).
- (`mirage_jax.select`, one layer up, lowers the best few and times them against XLA.)

Choices that differ from the original, and why (measurements on this 2-core CPU):

- The subexpression test is a table lookup (≈1 µs) on the saturated e-graph, not an egglog
  query per candidate (1-20 ms): on ntrans the queries alone took minutes.
- Distributivity only factors (a·b + a·c → a·(b+c)); expanding put 74,916 nodes in ntrans'
  e-graph (67 without) and made every monomial a "subexpression": a depth-5 enumeration took
  113 s against 1.1 s.
- A sum commutes with a factor only if the factor is free of the summed dimension (an egglog
  relation over the e-graph); the original's unconditional rule lets Σ_k X pass as a piece of
  X @ W. Together with placing constant scales only on factors: qknorm's hardest class went
  from 4,115 enumeration nodes to 659, and the whole qknorm search from 160 s (its one-piece
  enumeration used up its time share before the cut was tried) to 16 s.
- Loop and split-K states are tracked per tile ("partial sum over the loop"), so exp, sqrt,
  +eps or a product of partial sums are pruned before verification instead of after.
- Structure is separated from numbers: one verification per (structure, maximal grid) on the
  shrunk region instead of one per numeric instance at full size; the grid axes over output
  dimensions, which cannot change correctness unless reduced over, are added after the
  enumeration (9 enumerations for attention instead of 60: gqa_scaled 197 s → 16 s; the
  e-graph partner pre-filters then took it to 5 s).
- The kernel level is a small plan space, not an open-ended DFS: one graph-defined kernel, a
  split-K pair (a kernel of partial sums + a combining kernel: the original's GQA form, and
  flash decoding for the stable softmax), cuts at matmul prologues into pieces searched the
  same way, or up to `max_predefined` (2) pre-defined ops followed by graph-defined kernel(s).
  Pre-defined ops are generated depth-first in a canonical order and pruned by the same
  e-graph lookup, but only as GEMMs and their epilogues (a non-matmul op must read a
  pre-defined output: a prologue costs a round trip through memory that fusing avoids), and
  the graph-defined kernel after them reads the inputs an e-graph cover analysis says the
  rest needs (`Targets.covers`: rmsnorm after X @ W reads X and X @ W, not W). The combining
  step of a split stays a graph-defined kernel (`accum_sum_todimx` and a division, or the
  rescaling loop), where the original may use kn_reduction + kn_div. A deeper kernel-level
  DFS (the original's, over every op at every position) is what makes its searches take
  hours; this one adds 0.2-1.5 s per benchmark at b=1 (docs/decisions.md).
- The search returns µGraphs in cost order except that the best µGraphs of up to two other
  kernel-level plans (e.g. a GEMM + fused epilogue against one fused kernel) come right
  behind the best: the cost model ranks a cuBLAS GEMM against our tiles least reliably, and
  `select` times the first few.
"""

from mirage_jax.search.budget import Budget as Budget
from mirage_jax.search.cost import Cost as Cost
from mirage_jax.search.cost import Device as Device
from mirage_jax.search.cost import estimate as estimate
from mirage_jax.search.dims import analyse as analyse
from mirage_jax.search.dims import shrink as shrink
from mirage_jax.search.driver import SearchResult as SearchResult
from mirage_jax.search.driver import search as search
from mirage_jax.search.tasks import SearchError as SearchError
