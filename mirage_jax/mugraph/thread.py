"""The thread level: chains of elementwise ops fused into their producer's epilogue.

In Pallas/Triton the compiler owns threads, so the thread graph is not a separate IR but a
fusion decision over the block graph, as in the original's transpiler (a leading op plus a
chain of elementwise unary ops becomes per-element epilogues; MIRAGE.md §5): an elementwise
unary op whose argument has no other user is fused into that argument's producer.
"""

from __future__ import annotations

from mirage_jax.mugraph.graph import BlockGraph
from mirage_jax.mugraph.ops import OPS


def users(bg: BlockGraph) -> list[list[int]]:
    """For each block tensor (inputs first), the block tensors that read it (outputs as -1)."""
    n_in = len(bg.inputs)
    out: list[list[int]] = [[] for _ in range(n_in + len(bg.ops))]
    for k, op in enumerate(bg.ops):
        for a in dict.fromkeys(op.args):
            out[a].append(n_in + k)
    for o in bg.outputs:
        out[o.arg].append(-1)
    return out


def epilogues(bg: BlockGraph) -> dict[int, tuple[int, ...]]:
    """Leader tensor -> the chain of tensors fused into its epilogue (in order).

    A chain grows while the current tensor has exactly one user, that user is an elementwise
    unary op, and the current tensor is not a block input (inputs are loaded, not computed).
    """
    n_in = len(bg.inputs)
    us = users(bg)
    fused: set[int] = set()
    chains: dict[int, tuple[int, ...]] = {}
    for t in range(n_in, n_in + len(bg.ops)):
        if t in fused:
            continue
        chain, cur = [], t
        while len(us[cur]) == 1 and us[cur][0] >= 0:
            nxt = us[cur][0]
            spec = OPS[bg.ops[nxt - n_in].op]
            if spec.kind != "elementwise" or spec.arity != 1:
                break
            chain.append(nxt)
            fused.add(nxt)
            cur = nxt
        if chain:
            chains[t] = tuple(chain)
    return chains
