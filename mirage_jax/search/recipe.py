"""How a µGraph was built (its structure and numbers) as JSON, and its reduced instance from that.

The search verifies large regions' candidates on reduced instances (`search.reduced`), which
need the structure and numbers a µGraph was instantiated from. A µGraph carries them in its
meta (`RECIPE`, a JSON string), so that a later process (the cache's load check) can verify it
on the same reduced instance. Nothing in a recipe is trusted: `reduced_from_recipe` uses one
only where instantiating it at the region's sizes gives the µGraph itself, and where its
structure's labels of the region's inputs are the region's own dimensions.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from lax_ir.program import Program
from mirage_jax.mugraph import MuGraph, MuGraphError
from mirage_jax.search import dims as dims_mod
from mirage_jax.search.reduced import Reduced, reduced_instance
from mirage_jax.search.structure import KernelSpec, MappingClass, Numbers, Structure, instantiate

RECIPE = "recipe"
"""µGraph meta key: its structure and numbers (`encode`), where the search built it from them."""


def _enc(x: Any) -> Any:
    if isinstance(x, tuple):
        return {"t": [_enc(v) for v in x]}
    if isinstance(x, (frozenset, set)):
        return {"f": sorted((_enc(v) for v in x), key=json.dumps)}
    if isinstance(x, np.generic):
        return x.item()
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise TypeError(f"a recipe cannot hold {type(x).__name__}")


def _dec(x: Any) -> Any:
    if isinstance(x, dict):
        if set(x) == {"t"}:
            return tuple(_dec(v) for v in x["t"])
        if set(x) == {"f"}:
            return frozenset(_dec(v) for v in x["f"])
        raise ValueError(f"not a recipe value: {x!r}")
    if isinstance(x, list):
        raise ValueError("a recipe holds tuples, not lists")
    return x


def _fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def encode(s: Structure, nums: Numbers) -> str:
    """`s` and `nums` as a JSON string (raises TypeError for a value JSON cannot keep)."""
    kernels = []
    for k in s.kernels:
        d = {n: _enc(v) for n, v in _fields(k).items() if n != "mapping"}
        m = k.mapping
        d["mapping"] = None if m is None else {n: _enc(v) for n, v in _fields(m).items()}
        kernels.append(d)
    body = {
        "kernels": kernels,
        "outputs": _enc(s.outputs),
        "grids": _enc(nums.grids),
        "loops": _enc(nums.loops),
    }
    return json.dumps(body, sort_keys=True)


def decode(text: str) -> tuple[Structure, Numbers]:
    """The structure and numbers of `encode`'s string (ValueError, KeyError, TypeError where it
    is not one)."""
    d = json.loads(text)
    kernels = []
    for k in d["kernels"]:
        fields = {n: _dec(v) for n, v in k.items() if n != "mapping"}
        m = k.get("mapping")
        mapping = None if m is None else MappingClass(**{n: _dec(v) for n, v in m.items()})
        kernels.append(KernelSpec(**fields, mapping=mapping))
    structure = Structure(tuple(kernels), _dec(d["outputs"]))
    return structure, Numbers(_dec(d["grids"]), _dec(d["loops"]))


def reduced_from_recipe(g: MuGraph, program: Program) -> Reduced | None:
    """`g`'s reduced instance (`search.reduced`) from its meta's recipe, or None where it has
    none, the recipe does not rebuild `g` at the region's sizes, labels the region's inputs
    otherwise than the region's dimensions do, or allows no reduction."""
    text = g.meta.get(RECIPE)
    if not isinstance(text, str):
        return None
    try:
        s, nums = decode(text)
        dims = dims_mod.analyse(program)
        for k in s.kernels:
            for ref, labels in zip(k.args, k.input_labels or ()):
                if ref[0] == "in" and tuple(labels) != dims.axes[program.inputs[ref[1]]]:
                    return None
        sizes = dict(enumerate(dims.sizes))
        if instantiate(s, program.input_avals, sizes, nums).canonical_hash != g.canonical_hash:
            return None
        return reduced_instance(program, dims, s, nums)
    except (MuGraphError, ValueError, KeyError, TypeError, IndexError, dims_mod.ShrinkError):
        return None
