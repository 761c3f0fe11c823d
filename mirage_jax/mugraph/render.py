"""Rendering µGraphs for people: a text listing, a Graphviz dot export, and an SVG/PNG picture.

The picture is drawn with matplotlib (no Graphviz binary is needed): kernel ops in columns by
depth, arrows for kernel tensors, each graph-defined kernel a box with its block graph inside
(grid, inputs with imap / forloop dim and tile, the loop body, accumulators, the ops after the
loop, outputs with omap). `MuGraph._repr_svg_` uses it for inline display in Jupyter.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

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
                f"out {j} = t{o.arg}  omap {_map_str(o.omap)}  -> {list(info.output_shapes[j])}",
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


def draw(g: MuGraph):
    """A matplotlib Figure of the µGraph."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch, Rectangle

    depth: dict[int, int] = {}
    for i, op in enumerate(g.ops):
        depth[i] = 1 + max((depth[a[0]] for a in op.args), default=-1)
    cols: dict[int, list[int]] = {}
    for i in range(len(g.ops)):
        cols.setdefault(depth[i], []).append(i)
    rows = {i: _rows(g, i) for i in range(len(g.ops))}
    sizes = {}
    for i, rs in rows.items():
        w = max(len(t) * _CW + x for _, t, x, _ in rs) + 2 * _PAD
        sizes[i] = (w, rs[-1][3] + _PAD)
    gap_x, gap_y = 40.0, 18.0
    pos = {}
    x = gap_x / 2
    col_heights = {d: sum(sizes[i][1] for i in c) + gap_y * (len(c) - 1) for d, c in cols.items()}
    total_h = max(col_heights.values()) + gap_y
    for d in sorted(cols):
        cw = max(sizes[i][0] for i in cols[d])
        y = total_h - (total_h - col_heights[d]) / 2
        for i in cols[d]:
            w, h = sizes[i]
            pos[i] = (x + (cw - w) / 2, y - h)
            y -= h + gap_y
        x += cw + gap_x
    out_w = 70.0
    width = x + out_w
    fig = Figure(figsize=(width / 72, total_h / 72), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, total_h)
    ax.axis("off")
    for i, rs in rows.items():
        px, py = pos[i]
        w, h = sizes[i]
        color = _COLORS[rs[0][0]]
        ax.add_patch(
            FancyBboxPatch(
                (px, py),
                w,
                h,
                boxstyle="round,pad=0,rounding_size=4",
                fc=color,
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
    for i, op in enumerate(g.ops):
        for k, a in enumerate(op.args):
            sx, sy = pos[a[0]]
            sw, sh = sizes[a[0]]
            tx, ty0 = pos[i]
            th = sizes[i][1]
            ty = ty0 + th / 2 + (k - (len(op.args) - 1) / 2) * 6
            ax.annotate("", xy=(tx, ty), xytext=(sx + sw, sy + sh / 2), arrowprops=arrow)
    for n, r in enumerate(g.outputs):
        sx, sy = pos[r[0]]
        sw, sh = sizes[r[0]]
        oy = sy + sh / 2 + (n - (len(g.outputs) - 1) / 2) * _LH
        ax.annotate(
            "", xy=(width - out_w + 20, oy), xytext=(sx + sw, sy + sh / 2), arrowprops=arrow
        )
        ax.text(width - out_w + 24, oy, f"out {n}", fontsize=_FONT, family="monospace", va="center")
    return fig


def render(g: MuGraph, path: str | Path) -> Path:
    """Write the picture to `path` (.svg or .png, by extension)."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in ("svg", "png", "pdf"):
        raise ValueError(f"render writes .svg, .png or .pdf, not {path.suffix!r}")
    draw(g).savefig(path, format=fmt)
    return path


def to_svg(g: MuGraph) -> str:
    """The picture as SVG text (what Jupyter displays inline)."""
    buf = io.StringIO()
    draw(g).savefig(buf, format="svg")
    return buf.getvalue()
