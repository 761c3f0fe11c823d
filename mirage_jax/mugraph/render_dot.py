"""The µGraph picture drawn by Graphviz, where its `dot` program and the `graphviz` Python
package (a dependency of egglog) are both installed; `render.to_svg` and `render.render` use
it then, and matplotlib's drawing (`render.draw`) otherwise. `render` gives each op's text
rows and their colours (this module imports nothing of it: imports point one way).

The picture has the same content as matplotlib's: one box per kernel op, a graph-defined
kernel's block graph listed inside its box (sections coloured alike), arrows for the kernel
tensors, labels for the outputs. Graphviz lays the boxes out and routes the arrows around
them. (`render.to_dot` is another picture: the block graphs' ops as nodes of their own.)
"""

from __future__ import annotations

import html
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

MuGraph = Any
Lines = Mapping[int, Sequence[tuple[str, str]]]
_ROW_FILLS = ("in", "loop", "accum", "post", "out")


def available() -> bool:
    """Whether Graphviz can draw here: the `dot` program and the `graphviz` package."""
    if shutil.which("dot") is None:
        return False
    try:
        import graphviz  # noqa: F401
    except ImportError:
        return False
    return True


def picture_source(g: MuGraph, lines: Lines, colors: Mapping[str, str]) -> str:
    """The dot text of the picture (HTML-like labels, left to right): op i's box holds the
    (section, text) rows `lines[i]`, filled by `colors[section]`."""
    out = [
        "digraph mugraph {",
        "  rankdir=LR; nodesep=0.25; ranksep=0.45; splines=true; bgcolor=white;",
        '  node [shape=none, margin=0, fontname="monospace", fontsize=8];',
        '  edge [color="#5f6368", penwidth=0.8, arrowsize=0.6];',
    ]
    for i, op in enumerate(g.ops):
        out.append(f"  k{i} [label=<{_label(g, i, lines[i], colors)}>];")
        for k, a in enumerate(op.args):
            out.append(f"  k{a[0]} -> k{i} [tooltip={_quote(f'argument {k} of %{i}')}];")
    for n, r in enumerate(g.outputs):
        out.append(f'  out{n} [label="out {n}", shape=plaintext, margin=0.02];')
        out.append(f"  k{r[0]} -> out{n};")
    if g.outputs:
        out.append("  { rank=sink; " + " ".join(f"out{n};" for n in range(len(g.outputs))) + " }")
    out.append("}")
    return "\n".join(out)


def _label(g: MuGraph, i: int, lines: Sequence[tuple[str, str]], colors: Mapping[str, str]) -> str:
    """A box of rows: the op's head, then (for a graph-defined kernel) its block graph."""
    op = g.ops[i]
    rows = []
    last = None
    for section, text in lines:
        if section != last and (section == "loop" or (section == "accum" and last != "loop")):
            header = f"for i in range({op.block_graph.forloop_range}):"
            rows.append(
                '<TR><TD ALIGN="LEFT"><FONT POINT-SIZE="7" COLOR="#8a6d00">'
                f"{html.escape(header)}</FONT></TD></TR>"
            )
        indent = "&#160;&#160;" if section in ("loop", "accum") else ""
        body = indent + html.escape(text).replace(" ", "&#160;")
        if section in ("kernel", "accum") or (section in ("op", "input") and text[:1] == "%"):
            body = f"<B>{body}</B>"
        fill = f' BGCOLOR="{colors[section]}"' if section in _ROW_FILLS else ""
        rows.append(f'<TR><TD ALIGN="LEFT"{fill}>{body}</TD></TR>')
        last = section
    color = colors[lines[0][0]]
    return (
        f'<TABLE BORDER="1" CELLBORDER="0" CELLSPACING="1" CELLPADDING="3" STYLE="rounded" '
        f'BGCOLOR="{color}" COLOR="#5f6368">' + "".join(rows) + "</TABLE>"
    )


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def pipe(source: str, fmt: str) -> bytes:
    """dot text drawn in format `fmt` (svg, png, pdf, or plain: the layout's coordinates)."""
    import graphviz

    return graphviz.Source(source).pipe(format=fmt)
