"""Import of the original Mirage's checkpoint µGraphs (`kn_*`/`tb_*` JSON) into our IR.

A checkpoint file is a JSON list of µGraphs; each is a list of kernel ops with `input_tensors`
/`output_tensors` (guid, `dim` padded with zeros to 4, `num_dims`, `data_type`), and a
`kn_customized_op` carries a `bgraph` (grid_dim, forloop_range, reduction_dimx, `tb_*` ops with
`input_map`, `forloop_dim`, `output_map`). Maps are {"x","y","z"} -> dim or -1 (replicated).
Every op's recorded output dims are checked against our shape inference, so an import is also
a consistency test of our semantics. `data_type` codes: 941 is fp16 in the evaluation-era enum
(DT_BFLOAT16 = 940, DT_FLOAT16 = 941) and 921 is fp16 in the 2024 enum (DT_FLOAT16 = 921).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mirage_jax.mugraph.graph import (
    GRID_AXES,
    BlockGraphBuilder,
    MuGraph,
    MuGraphBuilder,
    MuGraphError,
)
from mirage_jax.mugraph.ops import OPS
from mirage_jax.mugraph.validate import block_info

DATA_TYPES = {941: "float16", 921: "float16", 950: "float32", 930: "float32"}


def _imports(prefix: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """Mirage op type -> (our op, params), from the op records' `imports` (`ops.py`)."""
    return {
        ty: (op.name, dict(params))
        for op in OPS.values()
        for ty, params in op.imports.items()
        if ty.startswith(prefix)
    }


KERNEL_OPS = _imports("kn_")
"""Pre-defined kernel ops: Mirage op type -> (our op, params)."""
BLOCK_OPS = _imports("tb_")
"""Block ops: Mirage op type -> (our op, params); a "dimx" of None is the bgraph's reduction_dimx."""


def _dims(t: dict) -> tuple[int, ...]:
    return tuple(int(d) for d in t["dim"][: t["num_dims"]])


def _dtype(t: dict, where: str) -> str:
    code = t.get("data_type")
    if code not in DATA_TYPES:
        raise MuGraphError(f"{where}: unknown data_type {code}")
    return DATA_TYPES[code]


def _map(m: dict, n_axes: int) -> tuple[int | None, ...]:
    return tuple(None if int(m[a]) < 0 else int(m[a]) for a in GRID_AXES[:n_axes])


def import_mugraph(ops: Sequence[dict], *, name: str = "mirage", source: str = "") -> MuGraph:
    """Convert one Mirage µGraph (a list of `kn_*` op dicts) into a MuGraph."""
    kb = MuGraphBuilder()
    tensors: dict[int, tuple[int, int]] = {}
    outputs: list[tuple[int, int]] = []
    for k, op in enumerate(ops):
        ty = op["op_type"]
        where = f"{source}: {name}: kernel op {k} ({ty})"
        if ty == "kn_input_op":
            t = op["output_tensors"][0]
            tensors[t["guid"]] = kb.input(_dims(t), _dtype(t, where))
        elif ty == "kn_output_op":
            outputs.append(_ref(tensors, op["input_tensors"][0], where))
        elif ty == "kn_customized_op":
            args, bg = _import_block_graph(op, tensors, where)
            refs = kb.graph_defined(args, bg)
            info = block_info(bg)
            for j, t in enumerate(op["output_tensors"]):
                if _dims(t) != info.output_shapes[j]:
                    raise MuGraphError(
                        f"{where}: output {j}: the checkpoint records {list(_dims(t))}, "
                        f"shape inference gives {list(info.output_shapes[j])}"
                    )
                tensors[t["guid"]] = refs[j]
        elif ty in KERNEL_OPS:
            our, params = KERNEL_OPS[ty]
            args = [_ref(tensors, t, where) for t in op["input_tensors"]]
            ref = kb.op(our, *args, **params)
            t = op["output_tensors"][0]
            try:
                shape, _ = kb.shape(ref)
            except MuGraphError as e:
                raise MuGraphError(f"{where}: {e}") from None
            if shape != _dims(t):
                raise MuGraphError(
                    f"{where}: the checkpoint records {list(_dims(t))}, shape inference gives {list(shape)}"
                )
            tensors[t["guid"]] = ref
        else:
            raise MuGraphError(f"{where}: unknown Mirage op type {ty!r}")
    if not outputs:
        raise MuGraphError(f"{source}: {name}: no kn_output_op")
    g = kb.build(outputs, name=name, source=source)
    g.shapes  # noqa: B018  (validate)
    return g


def _ref(tensors: dict, t: dict, where: str) -> tuple[int, int]:
    if t["guid"] not in tensors:
        raise MuGraphError(f"{where}: uses tensor {t['guid']} before it is defined")
    return tensors[t["guid"]]


def _import_block_graph(op: dict, tensors: dict, where: str):
    b = op["bgraph"]
    # Trailing grid axes of size 1 are dropped, with their (no-op) map entries.
    grid = tuple(int(b["grid_dim"][a]) for a in GRID_AXES)
    while len(grid) > 1 and grid[-1] == 1:
        grid = grid[:-1]
    n_axes = len(grid)
    bb = BlockGraphBuilder(grid, int(b["forloop_range"]))
    ids: dict[int, int] = {}
    recorded: dict[int, tuple[int, ...]] = {}
    args = []
    out_by_guid: dict[int, tuple[int, tuple]] = {}
    ops = b["operators"]
    for k, t_op in enumerate(ops):
        ty = t_op["op_type"]
        w = f"{where}: block op {k} ({ty})"
        if ty == "tb_input_op":
            d = t_op["dtensor"]
            imap = _map(t_op["input_map"], n_axes)
            f = int(t_op["forloop_dim"])
            t = t_op["output_tensors"][0]
            ids[t["guid"]] = bb.input(_dims(d), _dtype(d, w), imap, None if f < 0 else f)
            recorded[ids[t["guid"]]] = _dims(t)
            args.append(_ref(tensors, d, w))
    for k, t_op in enumerate(ops):
        ty = t_op["op_type"]
        w = f"{where}: block op {k} ({ty})"
        if ty == "tb_input_op":
            continue
        if ty == "tb_output_op":
            src = t_op["input_tensors"][0]["guid"]
            if src not in ids:
                raise MuGraphError(f"{w}: uses tensor {src} before it is defined")
            omap = _map(t_op["output_map"], n_axes)
            out_by_guid[t_op["dtensor"]["guid"]] = (ids[src], omap)
            continue
        if ty not in BLOCK_OPS:
            raise MuGraphError(f"{w}: unknown Mirage op type {ty!r}")
        our, params = BLOCK_OPS[ty]
        params = {k2: (int(b["reduction_dimx"]) if v is None else v) for k2, v in params.items()}
        srcs = []
        for t in t_op["input_tensors"]:
            if t["guid"] not in ids:
                raise MuGraphError(f"{w}: uses tensor {t['guid']} before it is defined")
            srcs.append(ids[t["guid"]])
        t = t_op["output_tensors"][0]
        ids[t["guid"]] = bb.op(our, *srcs, **params)
        recorded[ids[t["guid"]]] = _dims(t)
    for j, t in enumerate(op["output_tensors"]):
        if t["guid"] not in out_by_guid:
            raise MuGraphError(f"{where}: output {j} (tensor {t['guid']}) has no tb_output_op")
        bb.output(*out_by_guid[t["guid"]])
    bg = bb.build()
    info = block_info(bg)
    for tid, dims in recorded.items():
        if info.tiles[tid] != dims:
            raise MuGraphError(
                f"{where}: block tensor {tid}: the checkpoint records {list(dims)}, "
                f"shape inference gives {list(info.tiles[tid])}"
            )
    return args, bg


def load_mirage_checkpoint(path: str | Path) -> list[MuGraph]:
    """Import every µGraph of a Mirage checkpoint file (a JSON list of µGraphs).

    Unknown op types and data types raise `MuGraphError` naming them and the file.
    """
    path = Path(path)
    data = json.loads(path.read_text())
    if isinstance(data, dict):  # a single µGraph saved as {"graph": [...]} or similar
        data = [data.get("graph", data)]
    if data and isinstance(data[0], dict):  # one µGraph, not a list of them
        data = [data]
    return [
        import_mugraph(ops, name=f"{path.stem}[{i}]", source=str(path))
        for i, ops in enumerate(data)
    ]
