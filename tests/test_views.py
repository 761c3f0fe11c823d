"""`lax_ir.views`: interface layout steps a kernel reads through in place are exactly one free
reshape and one transpose of the stored array; anything else is refused."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lax_ir.interface import SplitView, apply_ops, read_view, write_view
from lax_ir.views import free_reshape, input_view, output_view, shape_after, view

GEMMA_K = (("transpose", (0, 2, 1, 3)), ("reshape", (2, 512, 128)), ("transpose", (0, 2, 1)))


def _same(shape, ops, got) -> None:
    x = np.arange(int(np.prod(shape))).reshape(shape)
    stored, perm = got
    np.testing.assert_array_equal(x.reshape(stored).transpose(perm), apply_ops(x, ops))


def test_a_cache_with_a_unit_batch_is_read_in_place_through_its_reshape():
    """Gemma's K at batch 1: the transpose moves the unit batch only, so the chain is one
    reshape and one transpose; at batch 8 it merges batch and heads, which is a copy."""
    got = view((1, 512, 2, 128), GEMMA_K)
    assert got == ((512, 2, 128), (1, 2, 0))
    _same((1, 512, 2, 128), GEMMA_K, got)
    steps, perm = input_view((1, 512, 2, 128), GEMMA_K)
    assert steps == (("reshape", (512, 2, 128)),) and perm == (1, 2, 0)
    batched = (("transpose", (0, 2, 1, 3)), ("reshape", (16, 512, 128)), ("transpose", (0, 2, 1)))
    assert view((8, 512, 2, 128), batched) is None


def test_a_view_that_would_not_coalesce_or_moves_nothing_is_not_read_in_place():
    # the stored contiguous axis (D) would be the outermost of the canonical array
    assert input_view((4, 8, 16), (("transpose", (2, 0, 1)),)) is None
    # transposes of unit axes only: no view, but one free reshape for any backend
    ops = (("transpose", (0, 2, 4, 1, 3)), ("reshape", (2, 128, 4)), ("transpose", (0, 2, 1)))
    assert input_view((1, 1, 2, 4, 128), ops) is None
    assert free_reshape((1, 1, 2, 4, 128), ops) == (("reshape", (2, 4, 128)),)


def test_steps_before_the_layout_steps_stay_with_xla():
    ops = (("scale", 0.5), ("reshape", (4, 2, 8)), ("transpose", (1, 0, 2)))
    steps, perm = input_view((4, 16), ops)
    assert steps == (("scale", 0.5), ("reshape", (4, 2, 8))) and perm == (1, 0, 2)


@st.composite
def _chains(draw, widen: bool = False):
    """(shape, ops): transposes and reshapes; with `widen`, broadcasts of size-1 axes too."""
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=1, max_size=4)))
    cur, ops = shape, []
    kinds = ["transpose", "reshape", "broadcast"] if widen else ["transpose", "reshape"]
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(kinds))
        if kind == "transpose":
            perm = tuple(draw(st.permutations(range(len(cur)))))
            ops.append(("transpose", perm))
            cur = tuple(cur[p] for p in perm)
        elif kind == "broadcast" and 1 in cur:
            cur = tuple(draw(st.sampled_from([1, 2, 3])) if d == 1 else d for d in cur)
            ops.append(("broadcast", cur))
        else:
            total, dims = int(np.prod(cur)), []
            while total > 1:
                d = draw(st.sampled_from([d for d in (2, 3, 4, 6) if total % d == 0]))
                dims.append(d)
                total //= d
            if draw(st.booleans()):
                dims.insert(draw(st.integers(0, len(dims))), 1)
            cur = tuple(dims) or (1,)
            ops.append(("reshape", cur))
    return shape, tuple(ops)


@settings(max_examples=400, deadline=None)
@given(_chains())
def test_every_view_found_computes_the_same_array(chain):
    shape, ops = chain
    got = view(shape, ops)
    if got is not None:
        _same(shape, ops, got)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1, max_size=5), st.data())
def test_chains_of_transposes_alone_are_always_views(shape, data):
    shape = tuple(shape)
    n = data.draw(st.integers(1, 3))
    ops = tuple(
        ("transpose", tuple(data.draw(st.permutations(range(len(shape)))))) for _ in range(n)
    )
    got = view(shape, ops)
    assert got is not None
    _same(shape, ops, got)


GPT2_OUT = (("transpose", (0, 2, 1)), ("reshape", (1, 16, 64, 512)))
GPT2_AFTER = (("transpose", (0, 3, 1, 2)), ("reshape", (1, 512, 1024)))


def _written(shape, out_ops, after, got) -> None:
    """The kernel's array reads as the output through the view; the region's output is it
    with the steps applied; what the program makes of it is the array itself, reshaped."""
    v, steps = got
    c = np.arange(int(np.prod(shape))).reshape(shape)
    written = write_view(c, v)
    np.testing.assert_array_equal(read_view(written, v), c)
    region = apply_ops(c, out_ops)
    np.testing.assert_array_equal(apply_ops(written, steps), region)
    final = apply_ops(region, after)
    np.testing.assert_array_equal(written.reshape(final.shape), final)


def test_attention_output_is_written_in_the_layout_the_program_wants():
    """GPT-2's (heads, T, D) attention output, which the program relays to (1, T, heads * D):
    written (T, heads, D), after which no data moves."""
    got = output_view((16, 512, 64), GPT2_OUT, GPT2_AFTER)
    assert got is not None and got[0] == (1, 0, 2)
    assert [op for op, _ in got[1]] == ["reshape", "transpose"]
    _written((16, 512, 64), GPT2_OUT, GPT2_AFTER, got)


SDPA_OUT = (("reshape", (8, 2, 512, 4, 128)), ("transpose", (0, 1, 4, 3, 2)))
SDPA_AFTER = (
    ("transpose", (3, 0, 4, 1, 2)),
    ("transpose", (1, 2, 3, 0, 4)),
    ("reshape", (8, 512, 8, 128)),
)


def test_a_grouped_attention_output_is_written_through_a_split_view():
    """sdpa's GQA output (B, kv heads, T * groups, D), rows (token, group), which the program
    lays out (B, T, heads, D): the rows' two parts are apart there (token outside the kv head,
    group inside it), so the kernel writes the program's array through a split view."""
    got = output_view((8, 2, 2048, 128), SDPA_OUT, SDPA_AFTER)
    assert got is not None
    v, steps = got
    assert isinstance(v, SplitView) and v.runs == ((8,), (2,), (512, 4), (128,))
    assert v.perm == (0, 2, 1, 3, 4) and steps[0] == ("reshape", (8, 512, 8, 128))
    _written((8, 2, 2048, 128), SDPA_OUT, SDPA_AFTER, got)


def test_outputs_that_gain_nothing_or_would_not_coalesce_are_left_alone():
    assert output_view((16, 512, 64), GPT2_OUT, ()) is None  # nothing follows
    assert output_view((16, 512, 64), (), (("reshape", (16, 512 * 64)),)) is None
    # the program wants D outermost: stores along D would not coalesce
    assert output_view((16, 512, 64), (), (("transpose", (2, 0, 1)),)) is None
    after = (("reshape", (4, 4, 512, 64)), ("transpose", (1, 0, 3, 2)))
    assert output_view((16, 512, 64), (), after) is None


def test_a_reshape_before_the_transpose_is_written_through_a_split_view():
    """A reshape first: not the permuted form, whose one transpose XLA folds into those that
    follow; the program's own array is written instead, whatever the steps in between."""
    after = (("reshape", (1, 16, 512, 64)), ("transpose", (0, 2, 1, 3)))
    got = output_view((16, 512, 64), (), after)
    assert got is not None and isinstance(got[0], SplitView)
    _written((16, 512, 64), (), after, got)


@settings(max_examples=300, deadline=None)
@given(_chains(), st.data())
def test_every_output_view_found_is_the_same_arrays(chain, data):
    shape, out_ops = chain
    cur = shape_after(shape, out_ops)
    perm = tuple(data.draw(st.permutations(range(len(cur)))))
    after = (("transpose", perm),)
    if data.draw(st.booleans()):
        after += (("reshape", (int(np.prod(cur)),)),)
    if data.draw(st.booleans()):
        after = (("reshape", (*cur[:-1], 1, cur[-1])), ("transpose", (*perm, len(cur))))
    got = output_view(shape, out_ops, after)
    if got is not None:
        _written(shape, out_ops, after, got)


def test_the_steps_after_an_attention_output_stop_at_the_next_region():
    """GPT-2's attention output: the transpose and reshape XLA runs after it count; the
    projection region's own reshape does not (that region reads the value, XLA does not)."""
    import lax_ir
    from experiments import models as M
    from lax_ir.views import layout_after

    m = M.get("gpt2_prefill", 1, "tiny")
    part = lax_ir.partition(lax_ir.capture(m.fn, *m.abstract_args()))
    inside = {i for r in part.regions for i in r.nodes}
    xla = set(range(len(part.program.nodes))) - inside
    (region,) = [r for r in part.regions if "exp" in r.program.op_counts()]
    (out,) = region.outputs
    after = layout_after(part.program, out, xla)
    assert [op for op, _ in after] == ["transpose", "reshape"], after
    assert len(layout_after(part.program, out)) > len(after)
    k = 0
    got = output_view(
        region.program.output_avals[k][0], region.program.meta["interface"]["outputs"][k], after
    )
    assert got is not None and got[0] == (1, 0, 2)
