"""What one block op does to the block tensors it reads: the rules the enumeration checks.

`BlockRules._apply(name, args, params, tensors)` returns the new block tensor (`BT`: its
abstract expression, tile, logical labels, and whether it is a partial sum, a softmax shift or
a rescaled sum) or why the op is refused there (labels, shape, partial, accumulator, ...).
Mixed into `enumerate.BlockEnumerator`, whose mapping (grid, split, loop) the rules read.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from mirage_jax.mugraph.ops import OPS, ShapeError
from mirage_jax.search import expr as E
from mirage_jax.search.structure import is_stack


@dataclass(frozen=True)
class BT:
    """A block tensor during enumeration (tile shape at the representative sizes)."""

    term: tuple
    tile: tuple[int, ...]
    labels: tuple
    post: bool
    partial: frozenset = frozenset()
    shift: bool = False  # a softmax shift value (a max)
    transfer: bool = False  # accum_sum without a loop: only an output may be one
    epilogue: bool = False  # an epilogue input, or its transfer: may meet accumulated tensors
    shifted: int | None = None  # the per-iteration shift this tile was computed with
    varies: frozenset = frozenset()  # for a shift: dimensions its max is partial over
    rescaled: int | None = None  # for an accum_rescale_* result: the final shift it used


def _ranked(t: BT, rank: int) -> BT:
    """t with leading unit axes (no label) up to `rank`."""
    pad = rank - len(t.labels)
    if pad <= 0:
        return t
    return replace(t, labels=(None,) * pad + tuple(t.labels), tile=(1,) * pad + tuple(t.tile))


def epilogue_pair(name: str, ts) -> bool:
    """A binary elementwise op of an epilogue input's transfer and an accumulated tensor."""
    if len(ts) != 2 or OPS[name].kind != "elementwise":
        return False
    a, b = ts
    if b.transfer and b.epilogue:
        a, b = b, a
    return a.transfer and a.epilogue and b.post and not b.transfer and not b.shift


class BlockRules:
    """The op rules of `BlockEnumerator` (a mixin: it reads the enumerator's mapping)."""

    def _apply(self, name: str, args: tuple, params: tuple, tensors) -> BT | str:
        ts = [tensors[a] for a in args]
        spec = OPS[name]
        if spec.kind == "accum":
            return self._accumulate(name, args, ts, dict(params))
        if any(t.post != ts[0].post for t in ts):
            return "loop/post mix"
        if any(t.transfer for t in ts) and not epilogue_pair(name, ts):
            return "canonical"
        if name not in ("sub",) and any(t.shift for t in ts):
            return "shift misuse"
        try:
            tile = tuple(spec.shape([t.tile for t in ts], dict(params)))
        except ShapeError:
            return "shape"
        post = ts[0].post
        if name == "matmul":
            return self._matmul(ts[0], ts[1], tile, post)
        if name == "concat_matmul":
            ac = self._matmul(ts[0], ts[2], tile, post)
            bd = self._matmul(ts[1], ts[3], tile, post)
            if isinstance(ac, str) or isinstance(bd, str):
                return ac if isinstance(ac, str) else bd
            if ac.partial != bd.partial:
                return "partial"
            return replace(ac, term=E.add(ac.term, bd.term))
        if spec.arity == 1:
            return self._unary(name, ts[0], tile, dict(params))
        got = self._binary(name, ts[0], ts[1], tile)
        if not isinstance(got, str) and got.shifted == -1:
            got = replace(got, shifted=args[1])
        return got

    def _depends(self, t: BT) -> frozenset:
        return t.partial | frozenset(lab for lab in t.labels if lab in self.pclasses) | t.varies

    def _merge_labels(self, a: BT, b: BT):
        """The labels of a broadcast of a and b (numpy's: aligned from the right, a missing
        leading axis a unit one), or None where they disagree."""
        rank = max(len(a.labels), len(b.labels))
        a, b = _ranked(a, rank), _ranked(b, rank)
        out = []
        for la, lb, na, nb in zip(a.labels, b.labels, a.tile, b.tile):
            if la is not None and lb is not None and la != lb:
                return None
            out.append(la if la is not None else lb)
            if na != nb and min(na, nb) != 1:
                return None
        return tuple(out)

    def _matmul(self, a: BT, b: BT, tile, post) -> BT | str:
        if len(a.labels) != len(b.labels):
            return "shape"
        k = a.labels[-1]
        if k != b.labels[-2] or is_stack(k):
            return "labels"
        batch = self._merge_labels(
            replace(a, labels=a.labels[:-2], tile=a.tile[:-2]),
            replace(b, labels=b.labels[:-2], tile=b.tile[:-2]),
        )
        if batch is None:
            return "labels"
        if a.partial and b.partial:
            return "partial"
        if a.partial & self._depends(b) or b.partial & self._depends(a):
            return "partial"
        if a.shifted is not None and b.shifted is not None and a.shifted != b.shifted:
            return "shift misuse"
        partial = a.partial | b.partial | ({k} & self.pclasses)
        labels = (*batch, a.labels[-2], b.labels[-1])
        term = E.red(k, E.mul(a.term, b.term))
        shifted = a.shifted if a.shifted is not None else b.shifted
        return BT(term, tile, labels, post, frozenset(partial), shifted=shifted)

    def _unary(self, name, x: BT, tile, params) -> BT | str:
        if x.partial and not E.is_scale(name, tuple(sorted(params.items()))):
            return "partial"
        t = x.term
        term = E.elementwise(name, t, params)
        if term is None and name in E.NORMS:
            lab = x.labels[-1]
            if x.partial or lab is None or lab in self.pclasses or is_stack(lab):
                return "partial"
            term = E.norm(name, lab, t, params.get("eps"))
        elif term is None and name in ("reduce_sum", "reduce_max"):
            d = params["dim"]
            lab = x.labels[d]
            if is_stack(lab):
                return "labels"
            labels = (*x.labels[:d], None, *x.labels[d + 1 :])
            if name == "reduce_max":
                if x.partial or x.shifted is not None:
                    return "partial"
                varies = frozenset({lab} & self.pclasses) | x.varies
                return BT(E.shift(lab, t), tile, labels, x.post, shift=True, varies=varies)
            partial = x.partial | ({lab} & self.pclasses)
            return BT(E.red(lab, t), tile, labels, x.post, frozenset(partial), shifted=x.shifted)
        elif term is None:
            return "vocabulary"
        return BT(term, tile, x.labels, x.post, x.partial, shifted=x.shifted)

    def _binary(self, name, a: BT, b: BT, tile) -> BT | str:
        if b.shift:  # only x - m, with m a shift of x's rows
            if name != "sub" or a.partial or a.shift:
                return "shift misuse"
            labels = self._merge_labels(a, b)
            if labels is None:
                return "labels"
            if a.shifted is not None:
                return "shift misuse"
            shifted = None
            if b.varies:
                shifted = -1  # filled by the caller: the index of b
            return BT(E.sub(a.term, b.term), tile, labels, a.post, shifted=shifted)
        labels = self._merge_labels(a, b)
        if labels is None:
            return "labels"
        if a.shifted != b.shifted and a.shifted is not None and b.shifted is not None:
            return "shift misuse"
        shifted = a.shifted if a.shifted is not None else b.shifted
        if name in ("add", "sub"):
            if a.partial != b.partial:
                return "partial"
            term = E.add(a.term, b.term) if name == "add" else E.sub(a.term, b.term)
            return BT(term, tile, labels, a.post, a.partial, shifted=shifted)
        if name == "mul":
            if a.partial and b.partial:
                return "partial"
            if a.partial & self._depends(b) or b.partial & self._depends(a):
                return "partial"
            return BT(
                E.mul(a.term, b.term), tile, labels, a.post, a.partial | b.partial, shifted=shifted
            )
        if name == "div":
            if b.partial or a.partial & self._depends(b):
                return "partial"
            return BT(E.div(a.term, b.term), tile, labels, a.post, a.partial, shifted=shifted)
        return "vocabulary"

    def _accumulate(self, name, args, ts, params) -> BT | str:
        x = ts[0]
        if x.post or x.transfer or (x.shift and name != "accum_max"):
            return "accumulator"
        L = self.loop
        if name == "accum_keep":
            # an input the loop does not walk, read after it (a residual or a bias added to a
            # GEMM that loops over K); without a loop `accum_sum` already says it
            if L is None or args[0] >= len(self.inputs) or x.partial or x.shift or x.shifted:
                return "accumulator"
            if self.mapping.fmap(x.labels) is not None:  # the loop walks it
                return "accumulator"
            return BT(x.term, x.tile, x.labels, True)
        if name == "accum_max":
            if not x.shift:
                return "accumulator"
            # a loop over a split dimension maxes the block's slice: still partial over it
            done = {L} - frozenset(self.mapping.split)
            return BT(x.term, x.tile, x.labels, True, shift=True, varies=x.varies - done)
        if name.startswith("accum_rescale"):
            if x.shifted != args[1] or not ts[2].post or not ts[2].shift:
                return "accumulator"
            got = self._accumulate(
                "accum_sum" if name == "accum_rescale_sum" else "accum_sum_last",
                args[:1], [replace(x, shifted=None)], params,
            )  # fmt: skip
            return got if isinstance(got, str) else replace(got, rescaled=args[2])
        elif x.shifted is not None:
            return "needs rescale"
        if name == "accum_sum":
            if L is not None:
                if L not in x.partial or L in x.labels:
                    return "accumulator"
                # a loop over a split dimension sums the block's slice: still partial over it
                done = {L} - frozenset(self.mapping.split)
                return BT(x.term, x.tile, x.labels, True, x.partial - done)
            return BT(x.term, x.tile, x.labels, True, x.partial, transfer=True, epilogue=x.epilogue)
        lab = x.labels[-1]
        tile = (*x.tile[:-1], 1)
        labels = (*x.labels[:-1], None)
        if name == "accum_sum_todimx":
            if not is_stack(lab) or lab[1] is None:
                return "accumulator"
            _, base, split = lab
            tile = (*x.tile[:-1], self.small[base])
            return BT(E.red(split, x.term), tile, (*x.labels[:-1], base), True, x.partial - {split})
        if is_stack(lab):
            if lab[1] is not None or name != "accum_sum_last":
                return "accumulator"
            return BT(E.red(lab[2], x.term), tile, labels, True, x.partial - {lab[2]})
        if lab is None:
            return "accumulator"
        if L is not None and lab != L and L not in x.partial:
            return "accumulator"  # the loop must be summed by this accumulator
        if L is not None and lab == L and L in x.partial:
            return "accumulator"
        partial = (x.partial - {L}) | ({lab} & frozenset(self.mapping.split))
        if name == "accum_sum_last":
            return BT(E.red(lab, x.term), tile, labels, True, partial)
        if partial or lab in self.mapping.split or x.partial:
            return "partial"
        if name == "accum_mean_last":
            return BT(E.mean(lab, x.term), tile, labels, True)
        if name == "accum_rms_last":
            return BT(E.rms(lab, x.term, params.get("eps")), tile, labels, True)
        return "vocabulary"
