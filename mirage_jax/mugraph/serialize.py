"""Our versioned JSON format for µGraphs: `to_json` / `from_json` round-trip exactly.

Layout (version 1):
    {"format": "mirage_jax.mugraph", "version": 1, "meta": {...},
     "ops": [{"op": "input", "params": {"index": 0, "shape": [2, 4096], "dtype": "float16"}},
             {"op": "graph_defined", "args": [[0, 0], [1, 0]], "block_graph": {
                 "grid": [256], "forloop_range": 32,
                 "inputs": [{"shape": [...], "dtype": "float16", "imap": [null], "forloop_dim": 1}],
                 "ops": [{"op": "accum_rms_last", "args": [0]}, ...],
                 "outputs": [{"arg": 5, "omap": [1]}]}}, ...],
     "outputs": [[2, 0]]}
Tensors are `[op index, output index]` at the kernel level and integer ids (inputs first) in a
block graph. Params hold ints, floats (exact: JSON keeps Python's shortest repr), strings and
tuples (written as lists). `meta` keeps only JSON-representable values.
"""

from __future__ import annotations

import json
from typing import Any

from mirage_jax.mugraph.graph import (
    BlockGraph,
    BlockInput,
    BlockOp,
    BlockOutput,
    KernelOp,
    MuGraph,
    MuGraphError,
)

FORMAT = "mirage_jax.mugraph"
VERSION = 1


def _enc(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_enc(x) for x in v]
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    raise MuGraphError(f"param value {v!r} of type {type(v).__name__} has no JSON form")


def _dec(v: Any) -> Any:
    return tuple(_dec(x) for x in v) if isinstance(v, list) else v


def _params(params) -> dict:
    return {k: _enc(v) for k, v in params}


def _unparams(d: dict | None) -> tuple:
    return tuple(sorted((k, _dec(v)) for k, v in (d or {}).items()))


def _opt(v):
    return None if v is None else int(v)


def block_graph_to_dict(bg: BlockGraph) -> dict:
    return {
        "grid": list(bg.grid),
        "forloop_range": bg.forloop_range,
        "inputs": [
            {
                "shape": list(b.shape),
                "dtype": b.dtype,
                "imap": list(b.imap),
                "forloop_dim": b.forloop_dim,
            }
            for b in bg.inputs
        ],
        "ops": [
            {
                "op": o.op,
                "args": list(o.args),
                **({"params": _params(o.params)} if o.params else {}),
            }
            for o in bg.ops
        ],
        "outputs": [
            {"arg": o.arg, "omap": list(o.omap), **({"dtype": o.dtype} if o.dtype else {})}
            for o in bg.outputs
        ],
    }


def block_graph_from_dict(d: dict) -> BlockGraph:
    return BlockGraph(
        grid=tuple(int(g) for g in d["grid"]),
        forloop_range=int(d["forloop_range"]),
        inputs=tuple(
            BlockInput(
                tuple(int(s) for s in b["shape"]),
                str(b["dtype"]),
                tuple(_opt(m) for m in b["imap"]),
                _opt(b.get("forloop_dim")),
            )
            for b in d["inputs"]
        ),
        ops=tuple(
            BlockOp(o["op"], tuple(int(a) for a in o["args"]), _unparams(o.get("params")))
            for o in d["ops"]
        ),
        outputs=tuple(
            BlockOutput(int(o["arg"]), tuple(_opt(m) for m in o["omap"]), o.get("dtype"))
            for o in d["outputs"]
        ),
    )


def _meta_value(v: Any) -> Any:
    """A meta value as JSON keeps it: scalars, and lists of scalars (per-kernel warps, the
    `select` tuning that lowering reads); None for anything else (not stored)."""
    scalar = (str, int, float, bool)
    if isinstance(v, scalar):
        return v
    if isinstance(v, (list, tuple)) and all(isinstance(x, scalar) for x in v):
        return list(v)
    return None


def to_dict(g: MuGraph) -> dict:
    ops = []
    for op in g.ops:
        d: dict[str, Any] = {"op": op.op}
        if op.args:
            d["args"] = [list(a) for a in op.args]
        if op.params:
            d["params"] = _params(op.params)
        if op.block_graph is not None:
            d["block_graph"] = block_graph_to_dict(op.block_graph)
        ops.append(d)
    meta = {k: m for k, v in g.meta.items() if (m := _meta_value(v)) is not None}
    return {
        "format": FORMAT,
        "version": VERSION,
        "meta": meta,
        "ops": ops,
        "outputs": [list(r) for r in g.outputs],
    }


def from_dict(d: dict) -> MuGraph:
    if d.get("format") != FORMAT:
        raise MuGraphError(f"not a µGraph JSON: format {d.get('format')!r}, expected {FORMAT!r}")
    if d.get("version") != VERSION:
        raise MuGraphError(f"µGraph JSON version {d.get('version')!r} is not supported ({VERSION})")
    ops = []
    for o in d["ops"]:
        bg = block_graph_from_dict(o["block_graph"]) if "block_graph" in o else None
        args = tuple((int(a[0]), int(a[1])) for a in o.get("args", ()))
        ops.append(KernelOp(o["op"], args, _unparams(o.get("params")), bg))
    return MuGraph.build(ops, [(int(r[0]), int(r[1])) for r in d["outputs"]], d.get("meta") or {})


def to_json(g: MuGraph, indent: int | None = None) -> str:
    """The µGraph as JSON text in our versioned format."""
    return json.dumps(to_dict(g), indent=indent, sort_keys=True)


def from_json(text: str) -> MuGraph:
    """Parse our JSON format (canonicalising: a canonical µGraph round-trips exactly)."""
    return from_dict(json.loads(text))
