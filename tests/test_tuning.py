"""Tuning tables: finding the one for this machine, and routing calls by it (CPU, with fakes)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from fp64_reference import expected, random_problem, rel_err
from matrix import MATRIX
from test_scaled_mm_layouts import cuda_fake

from fp8select import resolve, tuning
from fp8select.backends import scaled_mm as smm
from fp8select.capabilities import replace_caps
from fp8select.tuning_cache import TuningCacheWarning, new_table, save_table

H200 = MATRIX["h200-torch2.11"][0]


def _table(caps: Any, entries: dict[str, Any]) -> dict[str, Any]:
    table = new_table(caps.device_name, tuning.stack_versions(caps))
    table["entries"] = entries
    return table


def test_m_bucket() -> None:
    assert [tuning.m_bucket(m) for m in (0, 1, 2, 3, 4, 5, 16, 17, 8192, 9000)] == [1, 1, 2, 4, 4, 8, 16, 32, 8192, 8192]


def test_routes_pick_the_nearest_bucket_and_a_nearby_shape() -> None:
    table = _table(H200, {"2048,1024": {"1": {"backend": "a", "config": None, "us": 1.0},
                                         "64": {"backend": "b", "config": None, "us": 1.0}}})
    routes = tuning.routes_for(table, 2048, 1024)
    assert routes is not None and routes.exact
    assert routes.entry(1)["backend"] == "a" and routes.entry(4)["backend"] == "a"
    assert routes.entry(16)["backend"] == "b" and routes.entry(5000)["backend"] == "b"
    near = tuning.routes_for(table, 1024, 3072)  # 1.5x the weight size: close enough
    assert near is not None and not near.exact and near.shape == "2048,1024"
    assert tuning.routes_for(table, 16384, 16384) is None
    assert tuning.routes_for(None, 1, 1) is None


def test_layer_routes_per_m_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(smm, "_scaled_mm", lambda: cuda_fake(calls))
    base = resolve(H200, plugins=False, order=["cuda-scaled-mm", "reference"])
    table = _table(H200, {"256,512": {"1": {"backend": "reference", "config": None, "us": 1.0},
                                       "16": {"backend": "cuda-scaled-mm", "config": None, "us": 1.0},
                                       "64": {"backend": "reference", "config": None, "us": 1.0}}})
    selection = dataclasses.replace(base, tuning=table)
    w, s = random_problem(256, 512)
    layer = selection.prepare(w, s)
    assert [layer.plan(m).name for m in (1, 2, 8, 16, 32, 64, 500)] == \
        ["reference", "reference", "cuda-scaled-mm", "cuda-scaled-mm", "cuda-scaled-mm", "reference", "reference"]
    for m in (1, 16, 64):
        x = torch.randn(m, 512, dtype=torch.bfloat16)
        assert rel_err(layer(x), expected(x, w, s, (128, 128))) < 1e-2
    assert [c["m"] for c in calls] == [16]
    # a shape the table does not know (and no nearby one) keeps the static plan
    w2, s2 = random_problem(1024, 4096)
    assert selection.prepare(w2, s2).plan(1).name == "cuda-scaled-mm"


def test_table_naming_a_backend_outside_the_layer_is_ignored() -> None:
    base = resolve(MATRIX["cpu-only"][0], plugins=False)
    table = _table(H200, {"256,512": {"1": {"backend": "deepgemm", "config": None, "us": 1.0}}})
    layer = dataclasses.replace(base, tuning=table).prepare(*random_problem(256, 512))
    assert layer.plan(1).name == "reference"


def test_find_table_in_the_cache_dir(tmp_path: Path) -> None:
    caps = replace_caps(H200, env={"FP8SELECT_CACHE_DIR": str(tmp_path)})
    assert tuning.find_table(caps) is None  # cold cache: silent
    table = _table(caps, {"256,512": {"1": {"backend": "triton", "config": None, "us": 1.0}}})
    save_table(tmp_path / f"tuning-{tuning.table_fingerprint(caps)}.json", table)
    found = tuning.find_table(caps)
    assert found is not None and found["entries"] == table["entries"]
    # another torch: another fingerprint, so that file is not this machine's table
    assert tuning.find_table(replace_caps(caps, torch_version="2.12.0")) is None
    assert tuning.find_table(replace_caps(caps, device_kind="cpu", compute_capability=None)) is None


def test_explicit_table_from_another_device_or_corrupt_warns_once(tmp_path: Path) -> None:
    other = replace_caps(H200, device_name="NVIDIA H100 80GB HBM3")
    path = tmp_path / "table.json"
    save_table(path, _table(other, {}))
    caps = replace_caps(H200, env={"FP8SELECT_TUNING_TABLE": str(path), "FP8SELECT_CACHE_DIR": str(tmp_path / "c")})
    with pytest.warns(TuningCacheWarning, match="another device") as record:
        assert tuning.find_table(caps) is None
    assert len(record) == 1
    path.write_text(json.dumps(_table(H200, {}))[:40])
    with pytest.warns(TuningCacheWarning, match="ignored: (truncated|corrupt)"):
        assert tuning.find_table(caps) is None


def test_shipped_tables_are_valid_and_fingerprinted() -> None:
    from fp8select.tuning_cache import validate_table

    for path in tuning.SHIPPED_DIR.glob("tuning-*.json"):
        table = json.loads(path.read_text())
        assert validate_table(table) is None
        assert path.name == f"tuning-{table['fingerprint']}.json"
        for buckets in table["entries"].values():
            for entry in buckets.values():
                assert entry["backend"] in ("cuda-scaled-mm", "triton")
