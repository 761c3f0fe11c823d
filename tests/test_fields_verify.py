"""fields.verify: known-equal pairs are accepted, known-unequal pairs rejected; the Verdict."""

from __future__ import annotations

import importlib
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fields
import lax_ir
from lax_ir.program import Const, Node, Program, make_params


def spec(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def verify_fns(f, g, *specs, **kwargs) -> fields.Verdict:
    return fields.verify(lax_ir.capture(f, *specs), lax_ir.capture(g, *specs), **kwargs)


def rms_norm(x, eps=1e-6):
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def rms(x, eps=1e-6):
    return jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def naive_softmax(x):
    e = jnp.exp(x)
    return e / jnp.sum(e, axis=-1, keepdims=True)


ONES = np.ones((4, 32), np.float32)
ONES_BUT_ONE = ONES.copy()
ONES_BUT_ONE[3, 5] = 2.0
X = spec(4, 32)
W = spec(32, 24)
SQ = spec(16, 16)

# (name, f, g, specs): f and g compute the same real function.
EQUAL = [
    ("add_assoc", lambda x, y, z: (x + y) + z, lambda x, y, z: x + (y + z), (SQ, SQ, SQ)),
    ("mul_comm", lambda x, y: x * y, lambda x, y: y * x, (SQ, SQ)),
    ("matmul_assoc", lambda a, b, c: (a @ b) @ c, lambda a, b, c: a @ (b @ c), (SQ, SQ, SQ)),
    (
        "distributive",
        lambda a, b, c: a @ (b + c) * 2.0,
        lambda a, b, c: a @ b + a @ c + (a @ c + a @ b),
        (SQ, SQ, SQ),
    ),
    ("transpose_of_product", lambda a, b: (a @ b).T, lambda a, b: b.T @ a.T, (SQ, SQ)),
    ("rmsnorm_reassociated", lambda x, w: rms_norm(x) @ w, lambda x, w: (x @ w) / rms(x), (X, W)),
    ("softmax_shift", lambda x: jax.nn.softmax(x, axis=-1), naive_softmax, (X,)),
    (
        "split_k_sum",
        lambda x: jnp.sum(x, axis=-1),
        lambda x: jnp.sum(jnp.sum(x.reshape(4, 4, 8), axis=-1), axis=-1),
        (X,),
    ),
    (
        "split_k_matmul",
        lambda x, w: x @ w,
        lambda x, w: jnp.sum(
            jnp.transpose(x.reshape(4, 4, 8), (1, 0, 2)) @ w.reshape(4, 8, 24), axis=0
        ),
        (X, W),
    ),
    (
        "lora_concat",
        lambda x, w, a, b: x @ w + (x @ a) @ b,
        lambda x, w, a, b: jnp.concatenate([x, x @ a], axis=1) @ jnp.concatenate([w, b], axis=0),
        (spec(8, 32), spec(32, 24), spec(32, 4), spec(4, 24)),
    ),
    (
        "attention_division_past_matmul",
        lambda q, k, v: (naive_softmax(q @ k)) @ v,
        lambda q, k, v: (jnp.exp(q @ k) @ v) / jnp.sum(jnp.exp(q @ k), axis=-1, keepdims=True),
        (spec(2, 8, 4), spec(2, 4, 16), spec(2, 16, 4)),
    ),
    ("exp_homomorphism", lambda x, y: jnp.exp(x + y), lambda x, y: jnp.exp(x) * jnp.exp(y), (X, X)),
    ("silu", jax.nn.silu, lambda x: x * jax.nn.sigmoid(x), (X,)),
    ("mean_is_exact", lambda x: jnp.mean(x, axis=-1), lambda x: jnp.sum(x, -1) * (1 / 32), (X,)),
]


# (name, f, g, specs): f and g differ.
UNEQUAL = [
    ("changed_constant", lambda x: x * 0.5, lambda x: x * 0.25, (X,)),
    ("eps_1e-6_vs_1e-5", lambda x: rms_norm(x, 1e-6), lambda x: rms_norm(x, 1e-5), (X,)),
    ("swapped_matmul", lambda a, b: a @ b, lambda a, b: b @ a, (SQ, SQ)),
    ("wrong_axis", lambda x: jnp.sum(x, axis=0), lambda x: jnp.sum(x, axis=1), (SQ,)),
    ("exp_of_sum", lambda x, y: jnp.exp(x + y), lambda x, y: jnp.exp(x) + jnp.exp(y), (X, X)),
    (
        "shift_dependent_softmax",
        lambda x: jax.nn.softmax(x, axis=-1),
        lambda x: (
            jnp.exp(x - jax.lax.stop_gradient(jnp.max(x, -1, keepdims=True)))
            / jnp.sum(jnp.exp(x), -1, keepdims=True)
        ),
        (X,),
    ),
    ("missing_rms_normalisation", lambda x, w: rms_norm(x) @ w, lambda x, w: x @ w, (X, W)),
    ("missing_softmax_normalisation", naive_softmax, jnp.exp, (X,)),
    ("transpose_missing", lambda a: a @ a.T, lambda a: a @ a, (SQ,)),
    ("one_element_differs", lambda x: x * ONES, lambda x: x * ONES_BUT_ONE, (X,)),
]


@pytest.mark.parametrize("name,f,g,specs", EQUAL, ids=[e[0] for e in EQUAL])
def test_known_equal_pairs_are_accepted(name, f, g, specs):
    verdict = verify_fns(f, g, *specs)
    assert verdict, verdict.reason
    assert verdict.bound <= 1e-9 and verdict.trials >= 2


@pytest.mark.parametrize("name,f,g,specs", UNEQUAL, ids=[e[0] for e in UNEQUAL])
def test_known_unequal_pairs_are_rejected(name, f, g, specs):
    verdict = verify_fns(f, g, *specs)
    assert not verdict
    assert verdict.mismatched_outputs == (0,)
    assert verdict.reason


def test_shift_dependent_program_is_rejected_against_itself():
    f = lax_ir.capture(
        lambda x: jnp.exp(x - jax.lax.stop_gradient(jnp.max(x, -1, keepdims=True))), X
    )
    assert "reduce_max" in f.op_counts()
    assert not fields.verify(f, f)


def test_equality_up_to_a_permutation_of_outputs():
    a = lax_ir.capture(lambda x, y: (x + y, x * y, x @ y), SQ, SQ)
    b = lax_ir.capture(lambda x, y: ((y.T @ x.T).T, y * x, y + x), SQ, SQ)
    verdict = fields.verify(a, b)
    assert verdict and verdict.matching == (2, 1, 0)
    c = lax_ir.capture(lambda x, y: (x + y, x * y, y @ x), SQ, SQ)
    verdict = fields.verify(a, c)
    assert not verdict and verdict.mismatched_outputs == (2,)
    d = lax_ir.capture(lambda x, y: (x + y, x + y, x @ y), SQ, SQ)
    assert not fields.verify(a, d)  # every output of a needs its own partner


def test_verdict_records_and_serialises():
    f = lax_ir.capture(lambda x: x * 3.0, X)
    v = fields.verify(f, f, seed=7, trials=3)
    drawn = [fields.numbers.drawn_field(7, t) for t in range(3)]
    assert v.fields == tuple((f.p, f.q, f.omega) for f in drawn) and (v.p, v.q) == v.fields[0][:2]
    assert len({p for p, _, _ in v.fields}) == 3  # a fresh field per trial
    assert v.trials == 3 and v.seed == 7 and v.void_trials == 0 and v.matching == (0,)
    assert v.bound == pytest.approx(v.per_trial_bound**3)
    record = json.loads(v.to_json())
    assert record["equal"] is True and record["p"] == v.p and record["bound"] == v.bound
    # reproducible for a seed
    assert fields.verify(f, f, seed=7, trials=3) == v


def test_input_avals_must_agree():
    f = lax_ir.capture(lambda x: x, spec(3, 4))
    g = lax_ir.capture(lambda x: x, spec(4, 3))
    with pytest.raises(TypeError, match="input avals differ"):
        fields.verify(f, g)


def test_ops_without_field_meaning_raise_naming_the_op():
    f = lax_ir.capture(lambda x: jnp.maximum(x, 0.5), X)
    with pytest.raises(fields.FieldSemanticsError, match="max"):
        fields.verify(f, f)
    g = lax_ir.capture(lambda x: jnp.exp(jnp.exp(x)), X)
    with pytest.raises(fields.FieldSemanticsError, match="exp nested inside exp"):
        fields.verify(g, g)
    h = lax_ir.capture(lambda x: jnp.sort(x, axis=-1), X)
    with pytest.raises(fields.FieldSemanticsError, match="sort"):
        fields.verify(h, h)


def test_always_zero_denominator_is_void_then_rejected():
    f = lax_ir.capture(lambda x: x / (x - x), X)
    v = fields.verify(f, f, max_void_trials=3)
    assert not v and v.void_trials == 4 and "void" in v.reason


def test_hand_built_program_and_evaluate():
    nodes = [
        Node("input", (), (2, 3), "float32"),
        Node("constant", (), (), "float32", make_params(value=Const(0.5, "float32"))),
        Node("mul", (0, 1), (2, 3), "float32"),
        Node("reduce_sum", (2,), (2,), "float32", make_params(axes=(1,))),
    ]
    prog = Program.build(nodes, [0], [3])
    [out] = fields.evaluate(prog, [np.array([[2, 4, 6], [1, 1, 1]])])
    half = pow(2, -1, fields.default_field().p)
    assert list(out.p) == [6, 3 * half % fields.default_field().p]
    assert list(out.q) == [6, 3 * pow(2, -1, fields.default_field().q) % fields.default_field().q]


def test_integer_inputs_are_formal_variables():
    f = lax_ir.capture(lambda i: i * i, spec(5, dtype=jnp.int32))
    g = lax_ir.capture(lambda i: i, spec(5, dtype=jnp.int32))
    assert fields.verify(f, f) and not fields.verify(f, g)


def test_benchmark_programs_verify_against_themselves_at_small_size():
    from experiments import benchmarks

    for name in benchmarks.names():
        bench = benchmarks.get(name, 1).small()
        prog = lax_ir.capture(bench.fn, *bench.inputs)
        v = fields.verify(prog, prog)
        assert v and v.bound <= 1e-9, (name, v)


def test_mirage_forms_differ_from_ours():
    from experiments import benchmarks

    for name in ("rmsnorm", "ntrans", "qknorm"):
        ours = benchmarks.get(name, 1).small()
        theirs = benchmarks.get(name + "_mirage", 1).small()
        a = lax_ir.capture(ours.fn, *ours.inputs)
        b = lax_ir.capture(theirs.fn, *theirs.inputs)
        assert not fields.verify(a, b), name
    a, b = (benchmarks.get(n, 1).small() for n in ("gqa", "gqa_mirage"))
    assert fields.verify(lax_ir.capture(a.fn, *a.inputs), lax_ir.capture(b.fn, *b.inputs))


class SplitKMatmul:
    """A µGraph-like object: X @ W as a grid of 2 column blocks, each looping over 4 K-chunks."""

    input_avals = (((4, 32), "float32"), ((32, 24), "float32"))
    output_avals = (((4, 24), "float32"),)

    def __init__(self, wrong_omap: bool = False):
        self.wrong_omap = wrong_omap

    def interpret(self, inputs, algebra):
        x, w = inputs
        xs = algebra.transpose(algebra.reshape(x, (4, 4, 8)), (1, 0, 2))  # [loop, M, K/4]
        ws = algebra.reshape(w, (4, 8, 2, 12))  # [loop, K/4, grid, N/2]
        ws = algebra.transpose(ws, (2, 0, 1, 3))  # [grid, loop, K/4, N/2]
        xs = algebra.broadcast_in_dim(xs, (2, 4, 4, 8), (1, 2, 3))
        acc = algebra.reduce_sum(algebra.matmul(xs, ws, "float32"), (1,))  # [grid, M, N/2]
        perm = (1, 2, 0) if self.wrong_omap else (1, 0, 2)
        return [algebra.reshape(algebra.transpose(acc, perm), (4, 24))]


def test_verify_accepts_any_object_with_the_evaluation_interface():
    program = lax_ir.capture(lambda x, w: x @ w, X, W)
    assert fields.verify(program, SplitKMatmul())
    assert fields.verify(SplitKMatmul(), program)
    assert not fields.verify(program, SplitKMatmul(wrong_omap=True))
    assert fields.degree_bound(SplitKMatmul()).output == 2


def test_a_small_field_gives_a_weak_bound():
    mirage = fields.Field.from_primes(167, 83)
    f = lax_ir.capture(lambda x, w: rms_norm(x) @ w, X, W)
    g = lax_ir.capture(lambda x, w: (x @ w) / rms(x), X, W)
    v = fields.verify(f, g, field=mirage, max_void_trials=100)
    assert v and v.p == 167 and v.per_trial_bound > 1e-2 and v.trials > 5
    assert not fields.verify(f, lax_ir.capture(lambda x, w: x @ w, X, W), field=mirage)


def test_default_trials_reach_the_target_bound():
    f = lax_ir.capture(lambda x, w: rms_norm(x) @ w, X, W)
    v = fields.verify(f, f)
    assert v.per_trial_bound < 1e-4 and v.bound <= 1e-9
    assert v.trials == fields.verify(f, f, target_bound=1e-9).trials
    assert fields.verify(f, f, target_bound=1e-30).trials > v.trials


def test_degree_bounds_share_denominators_along_sums():
    def degree(fn, *specs):
        return fields.degree_bound(lax_ir.capture(fn, *specs))

    assert degree(lambda x, w: rms_norm(x) @ w, X, W).output == 3
    assert degree(lambda x, w: (x @ w) / rms(x), X, W).output == 3
    attention = (spec(2, 8, 4), spec(2, 4, 16), spec(2, 16, 4))
    d = degree(lambda q, k, v: naive_softmax(q @ k) @ v, *attention)
    assert d.output == 3 and d.exponent == 2
    # a sum of terms with distinct denominators: they multiply
    assert degree(lambda x, y: jnp.sum(x / y, axis=-1), X, X).output == (1 + 31) + 32
    # split-K through reshapes keeps the shared denominator
    split = lambda x: jnp.sum(jnp.sum((x / rms(x)).reshape(4, 4, 8), -1), -1)  # noqa: E731
    assert degree(split, X).output == 2
    assert degree(lambda x: jnp.sqrt(x @ x.T), SQ).uninterpreted == 2


@pytest.mark.parametrize(
    "name,f,g,specs", [EQUAL[0], EQUAL[-1], UNEQUAL[0], UNEQUAL[-1]], ids=lambda e: str(e)[:20]
)
def test_trials_run_apart_give_the_verdict_of_one_run(name, f, g, specs):
    """Attempts run alone (`run_trial`, as search workers do) and combined by `verify(...,
    outcomes=)` give exactly the verdict `verify` gives by itself, unequal pairs included."""
    verify_mod = importlib.import_module("fields.verify")  # the module, not the function

    a, b = lax_ir.capture(f, *specs), lax_ir.capture(g, *specs)
    verify_mod._MEMO.clear()
    alone = fields.verify(a, b, seed=3)
    verify_mod._MEMO.clear()
    n = fields.verify_plan(a, b)
    outcomes = {k: fields.run_trial(a, b, 3, k) for k in range(n)}
    combined = fields.verify(a, b, seed=3, outcomes=outcomes)
    assert combined == alone


def test_void_attempts_run_apart_are_made_up_here():
    f = lax_ir.capture(lambda x: x / (x - x), X)
    verify_mod = importlib.import_module("fields.verify")  # the module, not the function

    verify_mod._MEMO.clear()
    outcomes = {k: fields.run_trial(f, f, 0, k) for k in range(2)}
    assert all(agree is None for agree, _ in outcomes.values())
    v = fields.verify(f, f, max_void_trials=3, outcomes=outcomes)
    assert not v and v.void_trials == 4 and "void" in v.reason
