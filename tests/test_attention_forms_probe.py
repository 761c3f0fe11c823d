"""The hand-written attention of `experiments.attention_forms_probe`, compiled for the H100
without a GPU: its loop over keys is software-pipelined (cp.async copies), and on sm_90 without
TMA descriptors `warp_specialize` changes nothing (the probe's finding, H100 2026-11-27)."""

from __future__ import annotations

import pytest


def _ttgir(ws: bool, nprog: int = 0, flat: bool = False) -> str:
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from experiments.attention_forms_probe import fa

    B, T, NQ, NK, H, BM, BN = 8, 512, 8, 2, 128, 128, 64
    const = dict(T=T, S=T, NQ=NQ, NK=NK, H=H, BM=BM, BN=BN, CAUSAL=False, QL=0.1275, WS=ws)
    const |= dict(NPROG=nprog, FLAT=flat, NTILES=(T // BM) * B * NQ)
    sig = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp16"}
    sig |= dict.fromkeys(const, "constexpr")
    # jax-triton specializes each array argument as 16-byte aligned, as here
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(4)}
    src = ASTSource(fa, sig, constexprs=const, attrs=attrs)
    opts = dict(num_warps=8, num_stages=3)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ttgir"]


def test_the_probes_loop_is_pipelined_and_warp_specialize_is_a_no_op_on_sm90():
    plain = _ttgir(ws=False)
    assert plain.count("ttg.async_copy_global_to_local") >= 2  # K and V tiles
    assert plain.count("ttng.warp_group_dot ") == 2  # wgmma: Q·Kᵀ and P·V
    ws = _ttgir(ws=True)
    assert "{tt.warp_specialize}" in ws  # the loop is marked, and not partitioned:
    assert ws.replace(" {tt.warp_specialize}", "") == plain


def test_the_persistent_form_flattens_its_two_loops_into_one():
    persistent = _ttgir(ws=False, nprog=132, flat=True)
    assert persistent.count("scf.for") == 1 and "ttg.async_copy_global_to_local" in persistent
