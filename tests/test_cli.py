"""The `mirage-jax` command line: help texts, optimize, explain, bench, cache."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from mirage_jax import api
from mirage_jax.cache import Cache
from mirage_jax.cli import main, parse_arg
from tests.test_cache import rmsnorm_region

RMSNORM = ["experiments.benchmarks:rmsnorm_mirage", "--arg", "f16[2,256]", "--arg", "f16[256,384]"]


pytestmark = pytest.mark.usefixtures("quiet_mirage")


@pytest.fixture
def filled_cache(tmp_path):
    program, good, _ = rmsnorm_region()
    cache = Cache(tmp_path / "c.sqlite")
    cache.store(program, good, device_kind=api.device_kind(), backend="reference",
                timings={"mugraph_us": 8.0, "xla_us": 10.0})  # fmt: skip
    return cache


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_top_level_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("optimize", "explain", "bench", "cache"):
        assert cmd in out
    assert run(capsys)[1].startswith("usage: mirage-jax")


@pytest.mark.parametrize(
    "argv, words",
    [
        (["optimize"], ["MODULE:FUNCTION", "--arg", "--budget-s", "--backend", "--cache", "f16"]),
        (["explain"], ["MODULE:FUNCTION", "--arg", "--search", "--svg", "--listing"]),
        (["bench"], ["rmsnorm", "--batch", "--small", "--check", "--jit"]),
        (["cache"], ["ls", "show", "clear", "export", "import", "MIRAGE_JAX_CACHE"]),
        (["cache", "ls"], ["--cache"]),
        (["cache", "show"], ["key", "prefix"]),
        (["cache", "clear"], ["--cache"]),
        (["cache", "export"], ["JSON-lines"]),
        (["cache", "import"], ["JSON-lines"]),
    ],
)
def test_subcommand_help_is_complete(capsys, argv, words):
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for w in words:
        assert w in out, (argv, w)


def _option_help(text: str, flag: str) -> str:
    """The help of one option in a --help text, on one line."""
    lines = text.splitlines()
    start = next(k for k, ln in enumerate(lines) if ln.lstrip().startswith(flag + " "))
    end = next((k for k in range(start + 1, len(lines)) if lines[k].lstrip()[:1] == "-"), None)
    return " ".join(" ".join(lines[start:end]).split())


@pytest.mark.parametrize(
    "command, flags",
    [
        ("optimize", ["--budget-s", "--workers", "--seed", "--backend"]),
        ("explain", ["--budget-s", "--workers", "--backend", "--search"]),
        ("bench", ["--batch", "--backend", "--search"]),
    ],
)
def test_help_names_the_defaults(capsys, command, flags):
    from mirage_jax.api import DEFAULT_BUDGET_S
    from mirage_jax.cli import build_parser

    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    defaults = {o: a.default for a in sub._actions for o in a.option_strings}
    if "--budget-s" in flags:
        assert defaults["--budget-s"] == DEFAULT_BUDGET_S and defaults["--workers"] is None
    for flag in flags:
        if flag == "--workers":  # None: the machine's, said with its value here
            from mirage_jax.search.workers import default_workers

            assert f"at most 12: {default_workers()} here)" in _option_help(out, flag)
            continue
        assert f"default: {defaults[flag]})" in _option_help(out, flag), (command, flag)


def test_explain_passes_the_search_options(capsys, tmp_path, monkeypatch):
    import mirage_jax

    seen = {}
    real = mirage_jax.explain

    def spy(f, *args, **kwargs):
        seen.update(budget_s=f.opts.budget_s, workers=f.opts.workers, search=f.opts.search)
        return real(f, *args, **kwargs)

    monkeypatch.setattr(mirage_jax, "explain", spy)
    rc, _, _ = run(capsys, "explain", *RMSNORM, "--cache", str(tmp_path / "c.sqlite"),
                   "--backend", "reference", "--budget-s", "2.5", "--workers", "2")  # fmt: skip
    assert rc == 0 and seen == {"budget_s": 2.5, "workers": 2, "search": "cached"}


@pytest.mark.parametrize("models", [False, True])
def test_optimize_reproducible_has_no_wall_clock_stop(capsys, tmp_path, monkeypatch, models):
    """--reproducible searches with budget_s=inf, --max-candidates bounds each search."""
    import mirage_jax
    from mirage_jax import zoo
    from mirage_jax.cli_args import CommandError

    seen = {}

    def spy(*args, **kwargs):
        seen.update({k: kwargs.get(k) for k in ("budget_s", "reproducible", "max_candidates")})
        raise CommandError("stopped by the test")

    monkeypatch.setattr(mirage_jax, "superoptimize", spy)
    monkeypatch.setattr(zoo, "optimize_many", spy)
    target = ["--models", "sdpa_decode", "-b", "1"] if models else RMSNORM
    rc, _, err = run(capsys, "optimize", *target, "--cache", str(tmp_path / "c.sqlite"),
                     "--reproducible", "--max-candidates", "5")  # fmt: skip
    assert rc == 1 and "stopped by the test" in err
    if models:
        assert seen["reproducible"] is True and seen["max_candidates"] == 5
    else:
        assert seen == {"budget_s": float("inf"), "reproducible": None, "max_candidates": 5}


def test_parse_arg_specs_and_literals():
    assert parse_arg("f16[2,4096]") == jax.ShapeDtypeStruct((2, 4096), jnp.float16)
    assert parse_arg("bf16[8]") == jax.ShapeDtypeStruct((8,), jnp.bfloat16)
    assert parse_arg("float32[]") == jax.ShapeDtypeStruct((), jnp.float32)
    assert parse_arg("3") == 3 and parse_arg("(1, 2)") == (1, 2)


def test_bad_arguments_exit_2_with_a_message(capsys):
    rc, _, err = run(capsys, "explain", "experiments.benchmarks:rmsnorm", "--arg", "f99[2]")
    assert rc == 2 and "unknown dtype" in err
    rc, _, err = run(capsys, "explain", "no_such_module_xyz:fn")
    assert rc == 2 and "cannot load" in err
    rc, _, err = run(capsys, "optimize", "experiments.benchmarks")
    assert rc == 2 and "MODULE:FUNCTION" in err


def test_explain_prints_partition_and_cached_mugraph(capsys, filled_cache):
    rc, out, _ = run(capsys, "explain", *RMSNORM, "--cache", str(filled_cache.path),
                     "--backend", "reference")  # fmt: skip
    assert rc == 0
    assert "partition of rmsnorm_mirage: 1 Lax region(s)" in out
    assert "fused kernel (reference) from cache" in out and "rms_norm" in out
    assert "µGraph 8.00 µs against XLA 10.00 µs" in out


def test_explain_writes_pictures(capsys, filled_cache, tmp_path):
    rc, out, _ = run(capsys, "explain", *RMSNORM, "--cache", str(filled_cache.path),
                     "--backend", "reference", "--svg", str(tmp_path / "svg"))  # fmt: skip
    assert rc == 0 and (tmp_path / "svg" / "region0.svg").exists()
    assert "<svg" in (tmp_path / "svg" / "region0.svg").read_text()
    assert f"wrote {tmp_path / 'svg' / 'region0.svg'}" in out


def test_explain_svg_says_why_no_picture_was_written(capsys, filled_cache, tmp_path):
    svg = tmp_path / "svg"
    rc, out, _ = run(capsys, "explain", *RMSNORM, "--cache", str(tmp_path / "empty.sqlite"),
                     "--backend", "reference", "--svg", str(svg))  # fmt: skip
    assert rc == 0 and svg.is_dir() and list(svg.iterdir()) == []
    assert f"no picture was written to {svg}: no region has a µGraph" in out
    assert "(region 0: not in the cache" in out
    rc, out, _ = run(capsys, "explain", *RMSNORM, "--cache", str(filled_cache.path),
                     "--backend", "xla", "--svg", str(svg))  # fmt: skip
    assert rc == 0 and list(svg.iterdir()) == []
    assert "all run as XLA (region 0: --backend xla)" in out
    source = tmp_path / "no_lax.py"
    source.write_text("import jax.numpy as jnp\n\n\ndef f(x):\n    return jnp.sort(x)\n")
    rc, out, _ = run(capsys, "explain", f"{source}:f", "--arg", "f32[8]", "--cache",
                     str(filled_cache.path), "--backend", "reference", "--svg", str(svg))  # fmt: skip
    assert rc == 0 and list(svg.iterdir()) == []
    assert "the function has no Lax region" in out


def test_explain_svg_says_when_a_picture_cannot_be_drawn(
    capsys, filled_cache, tmp_path, monkeypatch
):
    from mirage_jax import mugraph

    def broken(g):
        raise RuntimeError("no fonts")

    monkeypatch.setattr(mugraph, "to_svg", broken)
    svg = tmp_path / "svg"
    rc, out, _ = run(capsys, "explain", *RMSNORM, "--cache", str(filled_cache.path),
                     "--backend", "reference", "--svg", str(svg))  # fmt: skip
    assert rc == 0 and list(svg.iterdir()) == []
    assert "no picture of region 0 was written: drawing it failed (RuntimeError: no fonts)" in out


def test_optimize_reports_hits_and_says_when_nothing_was_optimised(capsys, filled_cache):
    rc, out, _ = run(capsys, "optimize", *RMSNORM, "--cache", str(filled_cache.path),
                     "--backend", "reference", "-q")  # fmt: skip
    assert rc == 0 and "1 fused kernel(s)" in out
    rc, out, err = run(capsys, "optimize", "experiments.benchmarks:gqa", "--arg", "f16[2,16,16]",
                       "--arg", "f16[2,16,64]", "--arg", "f16[2,64,16]", "--cache",
                       str(filled_cache.path), "-q", "--backend", "xla")  # fmt: skip
    assert rc == 1 and "nothing was optimised" in err


def test_bench_keeps_working_and_runs_jit(capsys, tmp_path):
    rc, out, _ = run(capsys, "bench", "rmsnorm", "--small", "--check", "--jit",
                     "--cache", str(tmp_path / "c.sqlite"))  # fmt: skip
    assert rc == 0
    assert "partition of rmsnorm" in out and "rebuilt function vs float64 reference" in out
    assert "mirage_jax.jit vs float64 reference" in out
    rc, _, err = run(capsys, "bench", "nosuch")
    assert rc == 2 and "no benchmark" in err


def test_cache_ls_show_export_import_clear(capsys, filled_cache, tmp_path):
    path = str(filled_cache.path)
    rc, out, _ = run(capsys, "cache", "ls", "--cache", path)
    assert rc == 0 and "1 entry" in out and "µgraph" in out and "1.25x" in out
    key = filled_cache.entries()[0].key
    rc, out, _ = run(capsys, "cache", "--cache", path, "show", key[:10])
    assert rc == 0 and key in out and "rms_norm" in out and '"equal": true' in out
    assert run(capsys, "cache", "show", "ffff", "--cache", path)[0] == 2
    dump = tmp_path / "team.jsonl"
    assert run(capsys, "cache", "export", str(dump), "--cache", path)[0] == 0
    other = str(tmp_path / "other.sqlite")
    rc, out, _ = run(capsys, "cache", "import", str(dump), "--cache", other)
    assert rc == 0 and "imported 1 entry" in out
    assert [e.key for e in Cache(other).entries()] == [key]
    rc, _, err = run(capsys, "cache", "clear", "--cache", path)  # no terminal: it asks for --yes
    assert rc != 0 and "would delete 1 entry from" in err and "--yes" in err
    assert len(Cache(path).entries()) == 1
    rc, out, _ = run(capsys, "cache", "clear", "--yes", "--cache", path)
    assert rc == 0 and "cleared 1 entry" in out and Cache(path).entries() == []
    assert run(capsys, "cache", "path", "--cache", path)[1].strip() == path


def test_cache_uses_the_environment_variable(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("MIRAGE_JAX_CACHE", str(tmp_path / "env.sqlite"))
    rc, out, _ = run(capsys, "cache", "path")
    assert rc == 0 and out.strip() == str(tmp_path / "env.sqlite")


def test_cache_ls_says_which_function_and_shapes_a_region_came_from(capsys, tmp_path):
    import mirage_jax

    def scores(q, k):
        return jax.nn.softmax(q @ (2.0 * k).T, axis=-1)

    path = tmp_path / "c.sqlite"
    f = mirage_jax.jit(scores, backend="pallas-interpret", cache=path, workers=1, budget_s=5)
    f(jnp.ones((16, 32)), jnp.ones((16, 32)))
    rc, out, _ = run(capsys, "cache", "ls", "--cache", str(path))
    assert rc == 0 and "scores.region0(f32[16,32]" in out, out


def test_cli_hints_name_the_flag_not_the_python_keyword(capsys, tmp_path):
    """Issue 17: on a CPU the hint said `backend='pallas-interpret'`, the Python keyword."""
    rc, out, err = run(capsys, "explain", *RMSNORM, "--cache", str(tmp_path / "c.sqlite"),
                       "--svg", str(tmp_path / "svg"))  # fmt: skip
    assert rc == 0 and "XLA: no GPU" in out
    assert "--backend pallas-interpret" in out and "backend='" not in out + err


def test_optimize_models_on_a_cpu_names_the_flag(capsys, tmp_path, quiet_mirage):
    """Issue 17: `optimize --models` printed `backend='pallas-interpret'` in its table."""
    rc, out, err = run(capsys, "optimize", "--models", "sdpa", "-b", "1", "--quiet",
                       "--cache", str(tmp_path / "c.sqlite"))  # fmt: skip
    assert rc == 1 and "nothing was optimised: no GPU" in err
    assert "--backend pallas-interpret" in out + err and "backend='" not in out + err


def test_reproduce_help_names_no_internal_job_limit(capsys):
    with pytest.raises(SystemExit):
        main(["reproduce", "--help"])
    out = capsys.readouterr().out
    assert "--deadline-s" in out and "10-minute" not in out and "job limit" not in out
    assert "../shared" not in out and "mirage-project/mirage" in out  # --peer: how to get them


def test_cache_clear_asks_at_a_terminal(capsys, filled_cache, monkeypatch):
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    path = str(filled_cache.path)
    asked = []
    monkeypatch.setattr("sys.stdin", Terminal())
    monkeypatch.setattr("builtins.input", lambda prompt: asked.append(prompt) or "n")
    rc, out, _ = run(capsys, "cache", "clear", "--cache", path)
    assert rc == 1 and "nothing deleted" in out and len(Cache(path).entries()) == 1
    assert asked == [f"delete 1 entry of {path}? [y/N] "]
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    rc, out, _ = run(capsys, "cache", "clear", "--cache", path)
    assert rc == 0 and "cleared 1 entry" in out and Cache(path).entries() == []
