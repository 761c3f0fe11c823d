"""experiments/models/inspect_partition.py finds each model's one attention and reports it."""

from __future__ import annotations

import pytest

from experiments import models as M
from experiments.models import inspect_partition as I


@pytest.fixture(scope="module")
def reports():
    return {n: I.inspect(M.get(n, 1, "tiny")) for n in M.names()}


@pytest.mark.parametrize("name", M.names())
def test_one_attention_found_between_scores_and_values(reports, name):
    r = reports[name]
    (att,) = I.attentions(r.part)
    nodes, cfg = r.part.program.nodes, r.model.config
    # lax_ir matmuls are a[..., M, K] @ b[..., K, N], in whichever orientation capture chose
    for s in att.scores:  # QK: contracts head_dim, yields kv_len
        assert nodes[nodes[s].args[0]].shape[-1] == cfg.head_dim
        assert cfg.kv_len in nodes[s].shape[-2:]
    for v in att.values:  # PV: contracts kv_len, yields head_dim
        assert nodes[nodes[v].args[0]].shape[-1] == cfg.kv_len
        assert cfg.head_dim in nodes[v].shape[-2:]
    assert set(att.regions) <= {reg.index for reg in r.part.regions}


def test_render_has_a_row_and_a_section_per_model(reports):
    text = I.render(list(reports.values()), "tiny", 1)
    for name in M.names():
        assert sum(line.startswith(f"| {name} |") for line in text.splitlines()) == 1
        assert f"## {name}\n" in text
