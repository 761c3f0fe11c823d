"""Rendering µGraphs for people: a text listing, a Graphviz dot export, and an SVG/PNG picture.

The picture: each kernel op a box, each graph-defined kernel's box with its block graph inside
(grid, inputs with imap / forloop dim and tile, the loop body, accumulators, the ops after the
loop, outputs with omap), arrows for the kernel tensors. Graphviz draws it where its `dot`
program is installed (`render_dot.py`; it routes the arrows around the boxes); otherwise
matplotlib does (`draw`): kernel ops in columns by depth, each arrow through the gaps between
columns and through free lanes of the columns it skips, so that it crosses no box.
`MuGraph._repr_svg_` uses it for inline display in Jupyter.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mirage_jax.mugraph import render_dot
from mirage_jax.mugraph.ops import OPS
from mirage_jax.mugraph.validate import GRID_AXES, Ref, block_info

# `graph.py` builds on this module; its classes are named here for the annotations only.
BlockGraph = MuGraph = Any

_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}


def _aval(shape, dtype) -> str:
    return f"{_SHORT.get(dtype, dtype)}[{','.join(map(str, shape))}]"


def _ref(g: MuGraph, r: Ref) -> str:
    return f"%{r[0]}" if g.ops[r[0]].num_outputs == 1 else f"%{r[0]}.{r[1]}"


def _map_str(m) -> str:
    return (
        "{" + ", ".join(f"{GRID_AXES[a]}:{'φ' if d is None else d}" for a, d in enumerate(m)) + "}"
    )


def _grid_str(bg: BlockGraph) -> str:
    return "(" + ", ".join(f"{GRID_AXES[a]}={g}" for a, g in enumerate(bg.grid)) + ")"


def _params_str(params) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params)


def block_lines(bg: BlockGraph, arg_names=None) -> list[tuple[str, str]]:
    """(section, line) pairs describing a block graph; sections: head/in/loop/accum/post/out."""
    info = block_info(bg)
    n_in = len(bg.inputs)
    out = [("head", f"grid {_grid_str(bg)}  forloop_range {bg.forloop_range}")]
    for k, b in enumerate(bg.inputs):
        src = f" = {arg_names[k]}" if arg_names else ""
        fd = "φ" if b.forloop_dim is None else b.forloop_dim
        out.append(
            (
                "in",
                f"t{k}{src}  imap {_map_str(b.imap)}  forloop_dim {fd}  tile {list(info.tiles[k])}",
            )
        )
    body = []
    for k, op in enumerate(bg.ops):
        t = n_in + k
        args = ", ".join(f"t{a}" for a in op.args)
        ps = f" {{{_params_str(op.params)}}}" if op.params else ""
        kind = OPS[op.op].kind if op.op in OPS else "?"
        section = "accum" if kind == "accum" else ("post" if info.post[t] else "loop")
        body.append((section, f"t{t} = {op.op}({args}){ps} : {list(info.tiles[t])}"))
    # Display order: loop body, accumulators, then the ops after the loop (a topological order).
    rank = {"loop": 0, "accum": 1, "post": 2}
    out += sorted(body, key=lambda st: rank[st[0]])
    for j, o in enumerate(bg.outputs):
        out.append(
            (
                "out",
                f"out {j} = t{o.arg}  omap {_map_str(o.omap)}  -> {list(info.output_shapes[j])}"
                + (f"  stored {o.dtype}" if o.dtype else ""),
            )
        )
    return out


_HEADERS = {"loop": "for i in range({F}):", "accum": "accumulate over i:"}


def to_text(g: MuGraph) -> str:
    """A readable listing: kernel ops, each block graph indented under its kernel."""
    shapes = g.shapes
    name = g.meta.get("name", "mugraph")
    ins = ", ".join(f"%{i}: {_aval(*shapes[(i, 0)])}" for i in g.inputs)
    outs = ", ".join(_aval(*shapes[r]) for r in g.outputs)
    lines = [f"mugraph {name}({ins}) -> ({outs})  #{g.canonical_hash[:12]}"]
    for i, op in enumerate(g.ops):
        if op.op == "input":
            continue
        args = ", ".join(_ref(g, a) for a in op.args)
        res = ", ".join(_aval(*shapes[(i, j)]) for j in range(op.num_outputs))
        ps = f" {{{_params_str(op.params)}}}" if op.params else ""
        lines.append(f"  %{i} = {op.op}({args}){ps} : {res}")
        if op.block_graph is not None:
            last = None
            for section, text in block_lines(op.block_graph, [_ref(g, a) for a in op.args]):
                if section != last and section in _HEADERS:
                    lines.append(
                        "      " + _HEADERS[section].format(F=op.block_graph.forloop_range)
                    )
                indent = "        " if section in _HEADERS else "      "
                lines.append(f"{indent}{text}")
                last = section
    lines.append("  return " + ", ".join(_ref(g, r) for r in g.outputs))
    return "\n".join(lines)


def to_dot(g: MuGraph) -> str:
    """Graphviz dot text: kernel ops as nodes, each block graph as a cluster."""
    shapes = g.shapes
    lines = ["digraph mugraph {", "  rankdir=TB; node [shape=box, fontname=monospace];"]
    for i, op in enumerate(g.ops):
        if op.block_graph is None:
            label = f"%{i} {op.op}"
            if op.params:
                label += f"\\n{_params_str(op.params)}"
            label += f"\\n{_aval(*shapes[(i, 0)])}"
            lines.append(f'  k{i} [label="{_esc(label)}"];')
            for a in op.args:
                lines.append(f'  {_src(g, a)} -> k{i} [label="{_aval(*shapes[a])}"];')
            continue
        bg = op.block_graph
        info = block_info(bg)
        lines.append(f"  subgraph cluster_k{i} {{")
        lines.append(
            f'    label="%{i} graph_defined grid {_grid_str(bg)} forloop_range {bg.forloop_range}"; style=rounded;'
        )
        n_in = len(bg.inputs)
        for k, b in enumerate(bg.inputs):
            fd = "φ" if b.forloop_dim is None else b.forloop_dim
            label = f"t{k} input\\nimap {_map_str(b.imap)} fdim {fd}\\n{list(info.tiles[k])}"
            lines.append(f'    k{i}_t{k} [label="{_esc(label)}", shape=invhouse];')
        for k, o in enumerate(bg.ops):
            t = n_in + k
            style = ', style=filled, fillcolor="#fde8c8"' if OPS[o.op].kind == "accum" else ""
            label = f"t{t} {o.op}" + (f"\\n{_params_str(o.params)}" if o.params else "")
            lines.append(f'    k{i}_t{t} [label="{_esc(label)}\\n{list(info.tiles[t])}"{style}];')
            for a in o.args:
                lines.append(f"    k{i}_t{a} -> k{i}_t{t};")
        for j, o in enumerate(bg.outputs):
            label = f"out {j}\\nomap {_map_str(o.omap)}\\n{list(info.output_shapes[j])}"
            lines.append(f'    k{i}_o{j} [label="{_esc(label)}", shape=house];')
            lines.append(f"    k{i}_t{o.arg} -> k{i}_o{j};")
        lines.append("  }")
        for k, a in enumerate(op.args):
            lines.append(f"  {_src(g, a)} -> k{i}_t{k};")
    for n, r in enumerate(g.outputs):
        lines.append(f'  out{n} [label="output {n}", shape=oval];')
        lines.append(f"  {_src(g, r)} -> out{n};")
    lines.append("}")
    return "\n".join(lines)


def _src(g: MuGraph, r: Ref) -> str:
    op = g.ops[r[0]]
    return f"k{r[0]}_o{r[1]}" if op.block_graph is not None else f"k{r[0]}"


def _esc(s: str) -> str:
    return s.replace('"', '\\"')


# ---------------------------------------------------------------------------- the picture
_FONT = 8.0
_CW = _FONT * 0.61  # monospace advance, points
_LH = _FONT * 1.45
_PAD = 6.0
_COLORS = {
    "input": "#e8f0fe",
    "op": "#f1f3f4",
    "kernel": "#e6f4ea",
    "in": "#e8f0fe",
    "loop": "#fef7e0",
    "accum": "#fde8c8",
    "post": "#e6f4ea",
    "out": "#fce8e6",
}


def _node_lines(g: MuGraph, i: int) -> list[tuple[str, str]]:
    op = g.ops[i]
    shapes = g.shapes
    if op.op == "input":
        return [("input", f"%{i} input {op.param('index')}"), ("input", _aval(*shapes[(i, 0)]))]
    if op.block_graph is None:
        head = f"%{i} {op.op}" + (f" {{{_params_str(op.params)}}}" if op.params else "")
        return [("op", head), ("op", _aval(*shapes[(i, 0)]))]
    res = ", ".join(_aval(*shapes[(i, j)]) for j in range(op.num_outputs))
    lines = [("kernel", f"%{i} graph_defined -> {res}")]
    lines += block_lines(op.block_graph, [_ref(g, a) for a in op.args])
    return lines


def _rows(g: MuGraph, i: int) -> list[tuple[str, str, float, float]]:
    """(section, text, x indent, y offset from the top) of each text row of node i."""
    rows = []
    y = _PAD + _LH
    last = None
    is_kernel = g.ops[i].block_graph is not None
    for section, text in _node_lines(g, i):
        if is_kernel and section != last and section != "kernel":
            y += _PAD * 0.5
            if section == "loop" or (section == "accum" and last != "loop"):
                F = g.ops[i].block_graph.forloop_range
                rows.append(("header", f"for i in range({F}):", _PAD, y))
                y += _LH
        indent = 2 * _PAD if section in ("loop", "accum") else _PAD
        rows.append((section, text, indent, y))
        y += _LH
        last = section
    return rows


def _depths(g: MuGraph) -> dict[int, int]:
    """The column of each op: kernel ops by their longest path from the inputs, each input
    one column before its first reader (an input read late does not cross the picture)."""
    depth: dict[int, int] = {}
    readers: dict[int, list[int]] = {}
    for i, op in enumerate(g.ops):
        depth[i] = 1 + max((depth[a[0]] for a in op.args), default=-1)
        for a in op.args:
            readers.setdefault(a[0], []).append(i)
    for i, op in enumerate(g.ops):
        if op.op == "input" and readers.get(i):
            depth[i] = min(depth[r] for r in readers[i]) - 1
    order = {d: n for n, d in enumerate(sorted(set(depth.values())))}
    return {i: order[d] for i, d in depth.items()}


@dataclass
class Layout:
    """Where the picture puts everything, in points (y upwards): `boxes[i]` = (x, y, w, h) of
    op i, `edges` the arrows as polylines (the head at the last point), `outputs` the
    (x, y, text) of the output labels."""

    rows: dict[int, list[tuple[str, str, float, float]]]
    boxes: dict[int, tuple[float, float, float, float]]
    edges: list[list[tuple[float, float]]]
    outputs: list[tuple[float, float, str]]
    width: float
    height: float


_GAP_X, _GAP_Y, _MARGIN, _STUB, _LANE = 40.0, 18.0, 18.0, 6.0, 4.0


def layout(g: MuGraph) -> Layout:
    """Ops in columns by depth. Arrows cross the gaps between columns, and a column they skip
    through a free lane between (or above or below) its boxes: no arrow crosses a box."""
    depth = _depths(g)
    cols: dict[int, list[int]] = {}
    for i in range(len(g.ops)):
        cols.setdefault(depth[i], []).append(i)
    rows = {i: _rows(g, i) for i in range(len(g.ops))}
    sizes = {}
    for i, rs in rows.items():
        w = max(len(t) * _CW + x for _, t, x, _ in rs) + 2 * _PAD
        sizes[i] = (w, rs[-1][3] + _PAD)
    heights = {d: sum(sizes[i][1] for i in c) + _GAP_Y * (len(c) - 1) for d, c in cols.items()}
    total_h = max(heights.values()) + 2 * _MARGIN
    boxes: dict[int, tuple[float, float, float, float]] = {}
    spans: list[tuple[float, float]] = []  # each column's (left, right)
    x = _GAP_X / 2
    for d in sorted(cols):
        cw = max(sizes[i][0] for i in cols[d])
        y = total_h - (total_h - heights[d]) / 2
        for i in cols[d]:
            w, h = sizes[i]
            boxes[i] = (x + (cw - w) / 2, y - h, w, h)
            y -= h + _GAP_Y
        spans.append((x, x + cw))
        x += cw + _GAP_X
    spans.append((x, x))  # the output labels' column
    # Each arrow as (source column, source point, target column, target point).
    ends = []
    for i, op in enumerate(g.ops):
        bx, by, _, bh = boxes[i]
        starts = [_port(g, boxes, a) for a in op.args]
        # The arguments enter top to bottom in the order of their sources' heights.
        order = sorted(range(len(starts)), key=lambda k: (-starts[k][1], k))
        for slot, k in enumerate(order):
            ty = by + bh / 2 + ((len(op.args) - 1) / 2 - slot) * 6
            ends.append((depth[op.args[k][0]], starts[k], depth[i], (bx, ty)))
    outputs = []
    last = -1e9
    for want, n in sorted((_port(g, boxes, r)[1], n) for n, r in enumerate(g.outputs)):
        last = max(want, last + _LH)  # the labels at least a line apart
        outputs.append((x + 4, last, f"out {n}"))
        ends.append((depth[g.outputs[n][0]], _port(g, boxes, g.outputs[n]), len(cols), (x, last)))
    lanes = _lanes(ends, cols, boxes, total_h)
    edges = [_route(e, spans, lanes[n]) for n, e in enumerate(ends)]
    return Layout(rows, boxes, edges, sorted(outputs, key=lambda o: o[2]), x + 50.0, total_h)


def _port(g: MuGraph, boxes, r: Ref) -> tuple[float, float]:
    """Where output r[1] of op r[0] leaves its box: the right side, spread over its outputs."""
    bx, by, bw, bh = boxes[r[0]]
    n = g.ops[r[0]].num_outputs
    return bx + bw, by + bh / 2 + ((n - 1) / 2 - r[1]) * 6


def _lanes(ends, cols, boxes, height) -> list[dict[int, float]]:
    """Per arrow, the height at which it crosses each column it skips: in the free interval
    of that column nearest its straight line, arrows sharing an interval spread apart."""
    users: dict[tuple[int, int], list[tuple[float, int]]] = {}
    free: dict[int, list[tuple[float, float]]] = {}
    for n, (cs, (_, ys), ct, (_, yt)) in enumerate(ends):
        for c in range(cs + 1, ct):
            if c not in free:
                ys_ = sorted((boxes[i][1], boxes[i][1] + boxes[i][3]) for i in cols[c])
                tops = [0.0] + [top for _, top in ys_]
                bottoms = [bottom for bottom, _ in ys_] + [height]
                free[c] = list(zip(tops, bottoms))
            want = ys + (yt - ys) * (c - cs) / (ct - cs)
            gap = min(
                range(len(free[c])),
                key=lambda j: max(free[c][j][0] - want, want - free[c][j][1], 0.0),
            )
            users.setdefault((c, gap), []).append((want, n))
    lanes: list[dict[int, float]] = [{} for _ in ends]
    for (c, gap), wanted in users.items():
        lo, hi = free[c][gap]
        for y, (_, n) in zip(_spread(lo, hi, sorted(w for w, _ in wanted)), sorted(wanted)):
            lanes[n][c] = y
    return lanes


def _spread(lo: float, hi: float, wants: list[float]) -> list[float]:
    """Heights in (lo, hi), near the sorted `wants`, at least _LANE apart where they fit."""
    lo, hi = lo + _LANE, hi - _LANE
    if hi - lo < _LANE * (len(wants) - 1):
        return [lo + (hi - lo) * (k + 0.5) / len(wants) for k in range(len(wants))]
    ys = [min(max(w, lo), hi) for w in wants]
    for k in range(1, len(ys)):
        ys[k] = max(ys[k], ys[k - 1] + _LANE)
    ys[-1] = min(ys[-1], hi)
    for k in range(len(ys) - 2, -1, -1):
        ys[k] = min(ys[k], ys[k + 1] - _LANE)
    return ys


def _route(end, spans, lanes: dict[int, float]) -> list[tuple[float, float]]:
    """The polyline of one arrow: out of its box to the column's edge, across each gap (a
    short level stub at both sides), along its lane through each skipped column, into the
    target."""
    cs, (x0, y), ct, (x1, yt) = end
    points = [(x0, y)]
    for c in range(cs, ct):
        right, left = spans[c][1], spans[c + 1][0]
        y_next = lanes.get(c + 1, yt)
        points += [(right, y), (right + _STUB, y), (left - _STUB, y_next), (left, y_next)]
        y = y_next
    points.append((x1, yt))
    return [p for k, p in enumerate(points) if k == 0 or p != points[k - 1]]


def draw(g: MuGraph):
    """A matplotlib Figure of the µGraph (the layout of `layout`)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch, Rectangle

    lay = layout(g)
    fig = Figure(figsize=(lay.width / 72, lay.height / 72), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, lay.width)
    ax.set_ylim(0, lay.height)
    ax.axis("off")
    for i, rs in lay.rows.items():
        px, py, w, h = lay.boxes[i]
        ax.add_patch(
            FancyBboxPatch(
                (px, py),
                w,
                h,
                boxstyle="round,pad=0,rounding_size=4",
                fc=_COLORS[rs[0][0]],
                ec="#5f6368",
                lw=0.8,
            )
        )
        top = py + h
        for section, text, dx, dy in rs:
            base = top - dy
            if section == "header":
                ax.text(
                    px + dx,
                    base + _LH * 0.25,
                    text,
                    fontsize=_FONT * 0.85,
                    family="monospace",
                    color="#8a6d00",
                    va="baseline",
                )
                continue
            if section in ("in", "loop", "accum", "post", "out"):
                ax.add_patch(
                    Rectangle(
                        (px + _PAD * 0.5, base - _LH * 0.05),
                        w - _PAD,
                        _LH,
                        fc=_COLORS[section],
                        ec="none",
                    )
                )
            bold = section in ("kernel", "accum") or (
                section in ("op", "input") and text.startswith("%")
            )
            ax.text(
                px + dx,
                base + _LH * 0.25,
                text,
                fontsize=_FONT,
                family="monospace",
                va="baseline",
                weight="bold" if bold else "normal",
            )
    arrow = {"arrowstyle": "-|>", "color": "#5f6368", "lw": 0.8, "shrinkA": 0, "shrinkB": 0}
    for points in lay.edges:
        xs, ys = zip(*points[:-1], strict=True)
        ax.plot(xs, ys, color="#5f6368", lw=0.8, solid_joinstyle="round")
        ax.annotate("", xy=points[-1], xytext=points[-2], arrowprops=arrow)
    for x, y, text in lay.outputs:
        ax.text(x, y, text, fontsize=_FONT, family="monospace", va="center")
    return fig


ENGINES = ("auto", "graphviz", "matplotlib")
"""Who draws the picture: "graphviz" (`render_dot`; needs `dot` and the `graphviz` package),
"matplotlib" (`draw`), or "auto": Graphviz where it is available, else matplotlib."""


def picture_dot(g: MuGraph) -> str:
    """The dot text of the picture that Graphviz draws (`render_dot.picture_source`)."""
    return render_dot.picture_source(g, {i: _node_lines(g, i) for i in range(len(g.ops))}, _COLORS)


def _graphviz(engine: str) -> bool:
    """Whether to draw with Graphviz (an error for "graphviz" where it is missing)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "graphviz" and not render_dot.available():
        raise RuntimeError(
            "engine='graphviz' needs Graphviz's dot program on PATH and the graphviz Python "
            "package (e.g. apt-get install graphviz); engine='matplotlib' needs neither"
        )
    return engine == "graphviz" or (engine == "auto" and render_dot.available())


def _picture(g: MuGraph, fmt: str, engine: str) -> bytes:
    if _graphviz(engine):
        try:
            return render_dot.pipe(picture_dot(g), fmt)
        except Exception:
            if engine == "graphviz":
                raise  # "auto": matplotlib draws it instead
    buf = io.BytesIO()
    draw(g).savefig(buf, format=fmt)
    return buf.getvalue()


def render(g: MuGraph, path: str | Path, engine: str = "auto") -> Path:
    """Write the picture to `path` (.svg, .png or .pdf, by extension); `engine`: `ENGINES`."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in ("svg", "png", "pdf"):
        raise ValueError(f"render writes .svg, .png or .pdf, not {path.suffix!r}")
    path.write_bytes(_picture(g, fmt, engine))
    return path


def to_svg(g: MuGraph, engine: str = "auto") -> str:
    """The picture as SVG text (what Jupyter displays inline); `engine`: see `ENGINES`."""
    return _picture(g, "svg", engine).decode("utf-8")
