"""Finding the original Mirage's checkpoints (`experiments.peer`), and saying how to get them."""

from __future__ import annotations

import pytest

from experiments import peer


@pytest.fixture
def nowhere(monkeypatch, tmp_path):
    """No $MIRAGE_PEER_DIR and no default folder."""
    monkeypatch.delenv(peer.ENV, raising=False)
    monkeypatch.setattr(peer, "DEFAULTS", (tmp_path / "absent",))


def test_a_clone_of_the_evaluation_branch_is_laid_out_as_h100_and_a100(tmp_path, nowhere):
    clone = tmp_path / "mirage"
    for folder in ("saved_mugraphs_hopper", "saved_mugraphs"):
        (clone / "benchmark" / folder).mkdir(parents=True)
        (clone / "benchmark" / folder / "rmsnorm_bs1.json").write_text("[]")
    found = peer.find(clone)
    assert (found / "h100" / "rmsnorm_bs1.json").read_text() == "[]"
    assert (found / "a100" / "rmsnorm_bs1.json").is_file()
    assert peer.find(clone) == found  # the links are made once


def test_the_environment_and_the_h100_layout(tmp_path, monkeypatch, nowhere):
    assert peer.find() is None
    (tmp_path / "peer" / "mirage_mugraphs" / "h100").mkdir(parents=True)
    monkeypatch.setenv(peer.ENV, str(tmp_path / "peer"))
    assert peer.find() == tmp_path / "peer" / "mirage_mugraphs"
    assert peer.find(tmp_path / "elsewhere") is None  # an explicit folder is the only one


def test_the_skip_says_how_to_get_them():
    text = peer.HOW_TO_GET
    assert "https://github.com/mirage-project/mirage" in text and "--branch evaluation" in text
    assert peer.ENV in text
