"""What the front end does today with each real model: capture, partition, and a markdown report.

For each model of `experiments.models` (tiny size by default) this runs
`lax_ir.partition(lax_ir.capture(fn, *abstract_args))` and reports the Lax regions (op counts),
the residual ops with `classify`'s reasons, and how the attention fares: the scores matmul
(nearest matmul upstream of the softmax's exp), the probabilities-times-V matmul (nearest
downstream), which regions the path between them touches, which residual ops sit on that
path, and which residual ops feed it (cache writes, masks, rotary tables) through Lax
ops other than matmuls.

Run::

    PYTHONPATH=. python experiments/models/inspect_partition.py \
        [--size tiny] [--batch 1] [--out experiments/results/models_partition_before.md]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import lax_ir
from experiments import models as M
from lax_ir.program import Node, Program

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "models_partition_before.md"


def label(n: Node) -> str:
    """An op's name as a reader knows it: the JAX primitive for opaque nodes."""
    if n.op == "opaque":
        return n.param("payload").primitive.name
    return "tuple projection" if n.op == "get" else n.op


def _ops_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}×{v}" for k, v in sorted(counts.items()) if k != "constant")


def _reach(start: set[int], step) -> set[int]:
    seen, stack = set(start), list(start)
    while stack:
        for j in step(stack.pop()):
            if j not in seen:
                seen.add(j)
                stack.append(j)
    return seen


def _nearest_matmuls(p: Program, start: int, step) -> set[int]:
    """Matmuls first met walking from `start` along `step` (args or users), not past them."""
    found, seen, stack = set(), {start}, [start]
    while stack:
        for j in step(stack.pop()):
            if j in seen:
                continue
            seen.add(j)
            if p.nodes[j].op == "matmul":
                found.add(j)
            else:
                stack.append(j)
    return found


def _residual_frontier(p: Program, kinds: tuple[str, ...], path: set[int]) -> set[int]:
    """Residual ops whose values reach `path` from outside it through Lax non-matmul ops.

    Walks upstream from the path's operands, through Lax ops that are not matmuls (rotary
    arithmetic, KV-head repeats, reshapes), and stops at residual ops (collected), matmuls
    (the projections before attention) and inputs.
    """
    found: set[int] = set()
    stack = [a for i in path for a in p.nodes[i].args if a not in path]
    seen = set(stack)
    while stack:
        i = stack.pop()
        n = p.nodes[i]
        if kinds[i] == "residual":
            found.add(i)
            continue
        if n.op in ("matmul", "input"):
            continue
        for a in n.args:
            if a not in seen and a not in path:
                seen.add(a)
                stack.append(a)
    return found


@dataclass(frozen=True)
class Attention:
    """One softmax's attention path in the partition."""

    exp: int
    scores: tuple[int, ...]  # the QK matmuls
    values: tuple[int, ...]  # the PV matmuls
    regions: tuple[int, ...]  # regions the QK..PV path touches
    on_path: tuple[str, ...]  # residual ops on the path (labels, with repeats)
    feeding: tuple[str, ...]  # residual ops feeding the path (`_residual_frontier`)

    @property
    def whole(self) -> bool:
        """QK, softmax and PV in one region, nothing residual between."""
        return len(self.regions) == 1 and not self.on_path


def attentions(part: lax_ir.Partition) -> list[Attention]:
    """The attention paths of a partition, one per exp that lies between two matmuls."""
    p, kinds = part.program, part.classification.kinds
    users = p.users
    out = []
    for e, n in p.ops():
        if n.op != "exp":
            continue
        scores = _nearest_matmuls(p, e, lambda i: p.nodes[i].args)
        values = _nearest_matmuls(p, e, lambda i: users[i])
        if not scores or not values:
            continue
        down = _reach(scores, lambda i: users[i])
        up = _reach(values, lambda i: p.nodes[i].args)
        path = (down & up) | scores | values
        regions = sorted({r.index for i in path if (r := part.region_of(i)) is not None})
        on_path = sorted(label(p.nodes[i]) for i in path if kinds[i] == "residual")
        feeding = _residual_frontier(p, kinds, path)
        out.append(
            Attention(
                exp=e,
                scores=tuple(sorted(scores)),
                values=tuple(sorted(values)),
                regions=tuple(regions),
                on_path=tuple(on_path),
                feeding=tuple(label(p.nodes[a]) for a in sorted(feeding)),
            )
        )
    return out


@dataclass(frozen=True)
class Report:
    """The partition of one model, summarised."""

    model: M.Model
    part: lax_ir.Partition

    @property
    def nontrivial(self) -> list[lax_ir.Region]:
        return [r for r in self.part.regions if not r.is_trivial]

    def residual_groups(self) -> list[tuple[str, str, int]]:
        """(op, reason, count) over the residual ops, most frequent first."""
        p, reasons = self.part.program, self.part.classification.reasons
        c = Counter((label(p.nodes[i]), reasons.get(i, "")) for i in self.part.residual)
        return [(op, why, k) for (op, why), k in sorted(c.items(), key=lambda t: (-t[1], t[0]))]


def inspect(model: M.Model) -> Report:
    """Capture `model` on its abstract arguments and partition it."""
    program = lax_ir.capture(model.fn, *model.abstract_args())
    return Report(model, lax_ir.partition(program))


def _attention_text(r: Report) -> str:
    atts = attentions(r.part)
    if not atts:
        return "no softmax between two matmuls found"
    parts = []
    for a in atts:
        where = f"region {a.regions[0]}" if len(a.regions) == 1 else f"regions {list(a.regions)}"
        if a.whole:
            head = f"QK→softmax→PV whole in {where}"
        else:
            cut = ", ".join(f"{k}×{v}" for k, v in sorted(Counter(a.on_path).items()))
            head = f"split over {where}" + (f"; cut by {cut}" if cut else "")
        feed = ", ".join(f"{k}×{v}" for k, v in sorted(Counter(a.feeding).items()))
        parts.append(head + (f"; fed by residual {feed}" if feed else ""))
    return " / ".join(parts)


def render(reports: list[Report], size: str, batch: int) -> str:
    """The markdown report."""
    versions = {
        pkg: importlib.metadata.version(pkg) for pkg in ("jax", "jaxlib", "flax", "equinox")
    }
    dtype = reports[0].model.dtype.name if reports else ""
    lines = [
        "# The front end on the real-model set, before",
        "",
        f"Date {datetime.date.today().isoformat()}; "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
        + f". Size `{size}`, batch {batch}, {dtype}. Generated by "
        "`experiments/models/inspect_partition.py`: `lax_ir.partition(lax_ir.capture(fn, "
        "*abstract_args))` per model of `experiments.models`.",
        "",
        "Regions: Lax regions (trivial = only reshape/transpose/convert/broadcast). Attention: "
        "the path from the scores matmul (nearest matmul upstream of the softmax's exp) to the "
        "PV matmul (nearest downstream); 'cut by' = residual ops on that path, 'fed by' = "
        "residual ops whose values enter it through Lax ops other than matmuls (so the q/k/v "
        "projections and everything before them are not counted).",
        "",
        "| model | library | graph ops | regions (non-trivial) | ops in regions | residual ops "
        "| attention |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in reports:
        p = r.part.program
        n_ops = sum(1 for _, n in p.ops() if n.op != "constant")
        in_regions = sum(
            1 for reg in r.part.regions for i in reg.nodes if p.nodes[i].op != "constant"
        )
        lines.append(
            f"| {r.model.name} | {r.model.library} | {n_ops} | {len(r.part.regions)} "
            f"({len(r.nontrivial)}) | {in_regions} | {len(r.part.residual)} "
            f"| {_attention_text(r)} |"
        )
    for r in reports:
        lines += [
            "",
            f"## {r.model.name}",
            "",
            "| region | ops | in → out |",
            "| --- | --- | --- |",
        ]
        for reg in r.part.regions:
            trivial = " (trivial)" if reg.is_trivial else ""
            lines.append(
                f"| {reg.index}{trivial} | {_ops_text(reg.program.op_counts())} "
                f"| {len(reg.inputs)} → {len(reg.outputs)} |"
            )
        lines += ["", "| residual op | count | why (classify) |", "| --- | --- | --- |"]
        for op, why, k in r.residual_groups():
            lines.append(f"| {op} | {k} | {why} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="tiny", choices=M.SIZES)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    reports = [inspect(M.get(n, args.batch, args.size)) for n in M.names()]
    text = render(reports, args.size, args.batch)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
