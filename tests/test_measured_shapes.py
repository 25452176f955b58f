"""The served-shape catalogue: shapes derived from each model's configuration as the engines split them."""

from __future__ import annotations

import pytest

from fp8select import Fp8SelectError
from fp8select.measure import bench
from fp8select.measured.shapes import MODELS, TP_DEGREES, Gqa, Mla, served_shapes, shape_sets, unserved

COLUMN = {"q_b", "kv_b", "shared gate+up", "dense gate+up", "gate+up"}
ROW = {"o", "shared down", "dense down", "down"}


def test_deepseek_v3_at_tp1_is_the_benchmark_set_in_its_order() -> None:
    assert shape_sets()["deepseek-v3"] == ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168),
                                           (7168, 2048), (36864, 7168), (7168, 18432))
    assert shape_sets()["deepseek-r1:all"] == shape_sets()["deepseek-v3:all"]


def test_the_issues_qwen3_shapes_are_their_models() -> None:
    """Qwen3-8B's fused qkv and Qwen3-32B's qkv, gate+up and down, as measured in issue 25."""
    assert (6144, 4096) in shape_sets()["qwen3-8b"]
    assert set(shape_sets()["qwen3-32b"]) == {(10240, 5120), (5120, 8192), (51200, 5120), (5120, 25600)}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_column_parallel_layers_divide_n_and_row_parallel_layers_divide_k(name: str) -> None:
    layer = MODELS[name].layer
    whole = {p: (n, k) for p, n, k in layer.projections(1)}
    for tp in TP_DEGREES:
        if any(m == name and t == tp for m, t, _ in unserved()):
            continue
        for projection, n, k in layer.projections(tp):
            full_n, full_k = whole[projection]
            if projection in COLUMN:
                assert (n * tp, k) == (full_n, full_k), (projection, tp)
            elif projection in ROW:
                assert (n, k * tp) == (full_n, full_k), (projection, tp)
            elif projection == "q_a+kv_a":
                assert (n, k) == (full_n, full_k)
            else:
                assert projection == "qkv" and k == full_k


def test_fewer_kv_heads_than_gpus_keep_one_kv_head_per_gpu() -> None:
    layer = Gqa(hidden=4096, heads=64, kv_heads=4, head_dim=128, intermediate=None)
    qkv = {tp: dict((p, n) for p, n, _ in layer.projections(tp))["qkv"] for tp in TP_DEGREES}
    assert qkv == {1: (64 + 8) * 128, 2: (32 + 4) * 128, 4: (16 + 2) * 128, 8: (8 + 2) * 128}


def test_mla_projections_follow_the_configuration() -> None:
    layer = Mla(hidden=7168, heads=64, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                v_head_dim=128, intermediate=18432, moe_intermediate=2048, shared_experts=2)
    parts = {p: (n, k) for p, n, k in layer.projections(2)}
    assert parts["q_a+kv_a"] == (2112, 7168) and parts["q_b"] == (32 * 192, 1536) and parts["kv_b"] == (32 * 256, 512)
    assert parts["o"] == (7168, 32 * 128) and parts["shared gate+up"] == (4096, 7168) and parts["shared down"] == (7168, 2048)


def test_a_split_into_partial_blocks_is_not_served_and_says_why() -> None:
    assert [(m, tp) for m, tp, _ in unserved()] == [("qwen3-4b", 8)]
    assert "9728 / 8" in unserved()[0][2]
    assert "qwen3-4b:tp8" not in shape_sets() and "qwen3-4b:tp4" in shape_sets()
    layer = Gqa(hidden=2560, heads=40, kv_heads=8, head_dim=64, intermediate=None)  # 40 heads x 64 over 8: 320
    with pytest.raises(ValueError, match="q N 2560 / 8"):
        layer.projections(8)


def test_served_shapes_are_distinct_and_list_every_projection_they_serve() -> None:
    shapes = served_shapes()
    assert len({(s.n, s.k) for s in shapes}) == len(shapes)
    uses = {(u.model, u.projection, u.tp) for s in shapes for u in s.uses}
    expected = sum(len(MODELS[m].layer.projections(tp)) for m in MODELS for tp in TP_DEGREES
                   if not any(m == u and t == tp for u, t, _ in unserved()))
    assert len(uses) == expected
    down = next(s for s in shapes if (s.n, s.k) == (7168, 2048))
    assert down.describe() == "DeepSeek-V3/R1/V3.1 shared down TP1, o TP8; Kimi-K2 shared down TP1, o TP4"
    assert set(shape_sets()["served"]) == {(s.n, s.k) for s in shapes}


def test_parse_shapes_takes_every_set_name_mixed_with_pairs() -> None:
    for name, shapes in shape_sets().items():
        assert bench.parse_shapes(name.upper()) == list(shapes)
    assert bench.parse_shapes("qwen3-30b-a3b:tp8 128x256") == [(768, 2048), (2048, 512), (128, 256)]
    with pytest.raises(Fp8SelectError, match="qwen3-32b"):
        bench.parse_shapes("qwen3-32b:tp3")


def test_the_shipped_h200_table_measures_every_served_shape_at_every_bucket() -> None:
    """A served shape is a table hit on the H200: every backend the H200 vendors run, every M bucket
    (a model or degree added to the catalogue fails here until `tune --shapes served` measures it)."""
    from fp8select.backends.cutlass import CutlassBackend
    from fp8select.buckets import M_BUCKETS
    from fp8select.measured.table import SHIPPED_DIR, load_table, shape_key

    table = load_table(SHIPPED_DIR / "tuning-nvidia-h200.json", "NVIDIA H200")
    assert table is not None
    cutlass_takes = (CutlassBackend.n_multiple, CutlassBackend.k_multiple)  # its gate: whole 128-blocks
    backends = ("deepgemm", "flashinfer", "cuda-scaled-mm", "triton")
    rows = {(g["backend"], shape): set(buckets) for g in table["groups"] for shape, buckets in g["shapes"].items()}
    missing = [(b, f"{n}x{k}") for n, k in shape_sets()["served"]
               for b in (*backends, *(["cutlass"] if (n % cutlass_takes[0], k % cutlass_takes[1]) == (0, 0) else []))
               if rows.get((b, shape_key(n, k))) != {str(m) for m in M_BUCKETS}]
    assert missing == []
