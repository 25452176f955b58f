"""The tuning table on disk: rows per backend and versions, bad files ignored with one warning, atomic writes."""

from __future__ import annotations

import json
import multiprocessing
import warnings
from pathlib import Path
from typing import Any

import pytest

from fp8select import Capabilities, InvalidInputError
from fp8select.measured.table import (
    SCHEMA,
    SHIPPED_DIR,
    TuningCacheWarning,
    add_rows,
    backend_versions,
    cache_dir,
    check_table,
    load_table,
    merge_tables,
    new_table,
    save_table,
    table_path,
    validate_table,
)

VERSIONS = {"torch": "2.11.0+cu130", "cuda": "13.0", "triton": "3.6.0"}
DEVICE = "NVIDIA H200"
CONFIG = {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": 4, "num_warps": 4, "num_stages": 4,
          "path": "decode", "FIXUP": 1, "TMA": 0}


def _table(device: str = DEVICE, writer: int = 0) -> dict[str, Any]:
    table = new_table(device)
    table["groups"] = [
        {"backend": "cuda-scaled-mm", "versions": dict(VERSIONS),
         "shapes": {"12288,7168": {"16": {"us": 33.3 + writer}, "4096": {"us": 627.0}}}},
        {"backend": "triton", "versions": dict(VERSIONS),
         "shapes": {"2112,7168": {"1": {"us": 14.3, "config": {**CONFIG, "SPLIT_K": 1 + writer % 7}}}}},
    ]
    return table


def _load(path: Path, device: str | None = DEVICE) -> tuple[dict[str, Any] | None, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = load_table(path, device)
    return result, [str(w.message) for w in caught if issubclass(w.category, TuningCacheWarning)]


def test_round_trip(tmp_path: Path) -> None:
    table = _table()
    path = table_path(tmp_path / "sub" / "dir", DEVICE)
    save_table(path, table)
    loaded, caught = _load(path)
    assert loaded == table and caught == []
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")], "temporary file left behind"


def test_a_saved_table_keeps_the_files_mode_and_a_symlink(tmp_path: Path) -> None:
    """A new table gets a new file's mode (readable by a service account under umask 022; a temporary file is
    0600), a replaced one keeps its mode, and a table reached through a symlink is written through it."""
    import os

    path = tmp_path / "t.json"
    save_table(path, _table())
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask
    path.chmod(0o640)
    save_table(path, _table(writer=1))
    assert path.stat().st_mode & 0o777 == 0o640
    link = tmp_path / "link.json"
    link.symlink_to(path)
    save_table(link, _table(writer=2))
    assert link.is_symlink() and _load(path)[0] == _table(writer=2)


def test_add_rows_sets_aside_a_table_it_cannot_read(tmp_path: Path) -> None:
    """Another device's table, or a newer schema's, is moved aside, not overwritten; a usable one is merged into."""
    path = tmp_path / "t.json"
    for foreign in ({**_table("NVIDIA H100 80GB HBM3")}, {**_table(), "schema": SCHEMA + 1}):
        path.write_text(json.dumps(foreign))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            add_rows(path, DEVICE, _table())
        assert [("ignored" in str(w.message), "moved to" in str(w.message)) for w in caught] == [(True, False), (False, True)]
        assert json.loads((tmp_path / "t.json.set-aside").read_text()) == foreign
        assert _load(path)[0] == _table()
    more = new_table(DEVICE)
    more["groups"] = [{"backend": "triton", "versions": dict(VERSIONS), "shapes": {"7168,2048": {"1": {"us": 9.0}}}}]
    add_rows(path, DEVICE, more)
    assert _load(path)[0] == merge_tables(_table(), more)


def test_a_saved_table_has_one_line_per_shape(tmp_path: Path) -> None:
    table = _table()
    table["groups"][0]["shapes"]["4096,512"] = {"8192": {"us": 90.0}, "2": {"us": 5.0}}
    path = tmp_path / "table.json"
    save_table(path, table)
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = [line.strip() for line in lines if line.strip().startswith('"') and line.rstrip(",").endswith("}}")]
    # every shape on one line, shapes and buckets in numeric order
    assert rows == ['"4096,512": {"2": {"us": 5.0}, "8192": {"us": 90.0}},',
                    '"12288,7168": {"16": {"us": 33.3}, "4096": {"us": 627.0}}',
                    '"2112,7168": {"1": {"config": ' + json.dumps({**CONFIG, "SPLIT_K": 1}, sort_keys=True)
                    + ', "us": 14.3}}']


def test_a_configuration_is_checked_with_its_value_types() -> None:
    """Distinct configurations are checked once per process; True is not 1 there."""
    table = _table()
    assert validate_table(table) is None
    table["groups"][1]["shapes"]["2112,7168"]["1"]["config"]["SPLIT_K"] = True  # == 1, the valid value above
    assert "SPLIT_K" in (validate_table(table) or "")
    table["groups"][1]["shapes"]["2112,7168"]["1"]["config"]["SPLIT_K"] = [1]  # unhashable
    assert "SPLIT_K" in (validate_table(table) or "")


def test_missing_file_is_a_silent_cold_cache(tmp_path: Path) -> None:
    assert _load(tmp_path / "nope.json") == (None, [])


def test_versions_of_a_backend_are_its_own() -> None:
    caps = Capabilities(device_kind="cuda", device_name=DEVICE, compute_capability=(9, 0), torch_version="2.11.0+cu130",
                        cuda_version="13.0", packages={"triton": "3.6.0", "flashinfer": "0.7.2.post1", "deep_gemm": "2.6.1"})
    assert backend_versions(caps) == VERSIONS  # cuBLAS and Triton: installing FlashInfer changes nothing
    assert backend_versions(caps, ("flashinfer",)) == {**VERSIONS, "flashinfer": "0.7.2.post1"}
    assert backend_versions(caps, ("sgl_kernel",)) == VERSIONS  # not installed: not a key
    local = caps.with_overrides({"packages.deep_gemm": "2.6.1+54e2261"})
    assert backend_versions(local, ("deep_gemm",)) == {**VERSIONS, "deep_gemm": "2.6.1"}  # a local build, same release


def test_merge_keeps_both_and_newer_wins() -> None:
    old = _table()
    new = new_table(DEVICE)
    new["groups"] = [{"backend": "cuda-scaled-mm", "versions": dict(VERSIONS), "shapes": {"12288,7168": {"16": {"us": 30.0}}}},
                     {"backend": "deepgemm", "versions": {**VERSIONS, "deep_gemm": "2.6.1"},
                      "shapes": {"12288,7168": {"16": {"us": 28.0}}}}]
    merged = merge_tables(old, new)
    assert validate_table(merged) is None
    by = {g["backend"]: g["shapes"] for g in merged["groups"]}
    assert by["cuda-scaled-mm"]["12288,7168"] == {"16": {"us": 30.0}, "4096": {"us": 627.0}}
    assert by["deepgemm"]["12288,7168"]["16"]["us"] == 28.0 and "triton" in by
    assert old["groups"][0]["shapes"]["12288,7168"]["16"]["us"] == 33.3, "inputs are not modified"


def test_a_malformed_mapping_is_a_typed_error() -> None:
    with pytest.raises(InvalidInputError, match=r"tuning: .*groups\[0\]\.shapes\['1,1'\]\['4'\]\.us"):
        check_table({**_table(), "groups": [{"backend": "triton", "versions": {}, "shapes": {"1,1": {"4": {"us": "x"}}}}]})
    with pytest.raises(InvalidInputError, match="TritonConfig"):
        check_table({**_table(), "groups": [{"backend": "triton", "versions": {},
                                             "shapes": {"1,1": {"4": {"us": 1.0, "config": {"BLOCK_M": 16}}}}}]})
    assert check_table(_table()) == _table()


def _write_text(path: Path, text: str | bytes) -> None:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())


GOOD = json.dumps(_table(), indent=1)

BAD_FILES: dict[str, tuple[str | bytes, str]] = {
    "truncated": (GOOD[: len(GOOD) // 2], "truncated"),
    "truncated-one-char": (GOOD.rstrip()[:-1], "truncated"),
    "empty": ("", "truncated"),
    "garbage": ("{\"schema\": 2, nonsense}", "corrupt"),
    "binary": (b"\xff\xfe\x00garbage", "not UTF-8"),
    "not-an-object": ("[1, 2, 3]", "expected a JSON object"),
    "other-schema": (json.dumps({**_table(), "schema": 1}), "schema: expected 2, found 1"),
    "missing-groups": (json.dumps({k: v for k, v in _table().items() if k != "groups"}), "missing groups"),
    "unknown-top-key": (json.dumps({**_table(), "entries": {}}), "unknown key(s) entries"),
    "bad-shape-key": (json.dumps({**_table(), "groups": [{"backend": "x", "versions": {}, "shapes": {"12288x7168": {}}}]}),
                      "'N,K'"),
    "huge-shape-key": (json.dumps({**_table(), "groups": [{"backend": "x", "versions": {}, "shapes": {"9" * 5000 + ",1": {}}}]}),
                       "'N,K'"),
    "bad-bucket": (json.dumps({**_table(), "groups": [{"backend": "x", "versions": {}, "shapes": {"1,1": {"3": {"us": 1.0}}}}]}),
                   "M buckets"),
    "nan-time": (json.dumps({**_table(), "groups": [{"backend": "x", "versions": {},
                                                    "shapes": {"1,1": {"4": {"us": float("nan")}}}}]}), ".us"),
    "config-of-a-backend-without-one": (json.dumps({**_table(), "groups": [
        {"backend": "deepgemm", "versions": {}, "shapes": {"1,1": {"4": {"us": 1.0, "config": {}}}}}]}), "no configuration"),
    "bad-triton-config": (json.dumps({**_table(), "groups": [
        {"backend": "triton", "versions": {}, "shapes": {"1,1": {"4": {"us": 1.0, "config": {**CONFIG, "TMA": 2}}}}}]}),
        "TMA"),
    "group-keys": (json.dumps({**_table(), "groups": [{"backend": "x", "shapes": {}}]}), "expected keys"),
    "one-run": (json.dumps({**_table(), "groups": [{"backend": "x", "versions": {},
                                                   "shapes": {"1,1": {"4": {"us": 1.0, "runs": 1}}}}]}), ".runs"),
    "fractional-runs": (json.dumps({**_table(), "groups": [{"backend": "x", "versions": {},
                                                           "shapes": {"1,1": {"4": {"us": 1.0, "runs": 2.5}}}}]}), ".runs"),
    "folded-not-a-list": (json.dumps({**_table(), "folded": "run"}), "folded: expected a list of strings"),
    "other-device": (json.dumps(_table(device="NVIDIA B200")), "another device"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_tables_are_ignored_with_one_warning(tmp_path: Path, case: str) -> None:
    content, fragment = BAD_FILES[case]
    path = tmp_path / "table.json"
    _write_text(path, content)
    loaded, caught = _load(path)
    assert loaded is None
    assert len(caught) == 1, caught
    assert fragment in caught[0] and str(path) in caught[0]


def test_directory_in_place_of_the_file(tmp_path: Path) -> None:
    (tmp_path / "t.json").mkdir()
    loaded, caught = _load(tmp_path / "t.json")
    assert loaded is None and len(caught) == 1 and "unreadable" in caught[0]


def test_save_rejects_a_malformed_table(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="schema"):
        save_table(tmp_path / "t.json", {**_table(), "schema": 7})
    with pytest.raises(InvalidInputError, match="us"):
        save_table(tmp_path / "t.json", {**_table(), "groups": [{"backend": "x", "versions": {},
                                                                 "shapes": {"1,1": {"4": {"us": -1}}}}]})
    assert not list(tmp_path.iterdir()), "nothing may be written for a rejected table"


def test_new_table_is_valid_and_named_by_device(tmp_path: Path) -> None:
    assert validate_table(new_table(DEVICE)) is None and new_table(DEVICE)["schema"] == SCHEMA
    assert table_path(tmp_path, "NVIDIA H200") == tmp_path / "tuning-nvidia-h200.json"
    assert table_path(tmp_path, "AMD Instinct MI300X") == tmp_path / "tuning-amd-instinct-mi300x.json"


def test_cache_dir_precedence(tmp_path: Path) -> None:
    assert cache_dir({"FP8SELECT_CACHE_DIR": str(tmp_path / "c")}) == tmp_path / "c"
    assert cache_dir({"FP8SELECT_CACHE_DIR": str(tmp_path / "c"), "XDG_CACHE_HOME": "/x"}) == tmp_path / "c"
    assert cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "fp8select"
    assert cache_dir({"XDG_CACHE_HOME": "relative/ignored"}) == Path.home() / ".cache" / "fp8select"
    assert cache_dir({}) == Path.home() / ".cache" / "fp8select"


def test_cache_dir_from_a_snapshot_env() -> None:
    from fp8select import Capabilities

    caps = Capabilities(env={"FP8SELECT_CACHE_DIR": "/somewhere/else"})
    assert cache_dir(caps.env) == Path("/somewhere/else")


def _big_table(writer: int) -> dict[str, Any]:
    """A table of a few hundred kB, so a non-atomic write would be seen half done."""
    table = _table(writer=writer)
    for n in range(1, 800):
        table["groups"][0]["shapes"][f"{n},7168"] = {str(1 << b): {"us": float(n + b)} for b in range(4)}
    return table


ROUNDS = 15


def _writer(path: str, writer: int, rounds: int) -> None:
    for i in range(rounds):
        save_table(path, _big_table(writer * 1000 + i))


def _reader(path: str, rounds: int, queue: Any) -> None:
    bad = 0
    for _ in range(rounds):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            table = load_table(path, DEVICE)
        if table is None or caught:
            bad += 1
    queue.put(bad)


def test_concurrent_writers_leave_a_valid_file(tmp_path: Path) -> None:
    path = tmp_path / "cache" / "table.json"
    save_table(path, _big_table(0))
    # fork where there is one: the children only write files, and it spares each a fresh torch import.
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(path), w, ROUNDS)) for w in range(4)]  # type: ignore[attr-defined]
    procs.append(ctx.Process(target=_reader, args=(str(path), 100, queue)))  # type: ignore[attr-defined]
    for p in procs:
        p.start()
    try:
        bad_reads = queue.get(timeout=120)
    finally:
        for p in procs:
            p.join(timeout=120)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    assert bad_reads == 0, "a reader saw a missing, partial or invalid table during concurrent writes"
    loaded, caught = _load(path)
    assert loaded is not None and caught == []
    writer = loaded["groups"][0]["shapes"]["12288,7168"]["16"]["us"] - 33.3
    assert round(writer) % 1000 == ROUNDS - 1, "the last complete table of some writer is what remains"
    assert not [p.name for p in path.parent.iterdir() if p.name != "table.json"], "temporary files left behind"


def _fastest(call: Any) -> float:
    """The least of seven timed calls, in seconds."""
    import time

    times = []
    for _ in range(7):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def test_reading_the_shipped_table_costs_a_small_multiple_of_parsing_its_json() -> None:
    """A table checked row by row (one from the cache directory, or the shipped one read the same way): the checks
    and the index stay linear and cheap (about 3x the JSON parse today; a ratio in one process, not an absolute
    time)."""
    from fp8select.measured.model import Measurements
    from fp8select.measured.table import SHIPPED_DIR, load_table

    path = SHIPPED_DIR / "tuning-nvidia-h200.json"
    table = load_table(path, "NVIDIA H200")
    assert table is not None
    installed = {g["backend"]: g["versions"] for g in table["groups"]}

    parse = _fastest(lambda: json.loads(path.read_text(encoding="utf-8")))
    read = _fastest(lambda: Measurements("NVIDIA H200", [load_table(path, "NVIDIA H200")], installed))  # type: ignore[list-item]
    assert read < 8 * parse
    assert path.stat().st_size < 80 * sum(len(b) for g in table["groups"] for b in g["shapes"].values())  # bytes a row


def test_the_shipped_tables_pass_every_check_so_resolve_reads_only_their_header(tmp_path: Path) -> None:
    """fp8select's own tables are read with the header check alone (their rows cost 60% of a full read): this
    test is what checks their rows. A table from elsewhere is checked whole: a bad row there still refuses it."""
    from fp8select.measured.table import SHIPPED_DIR, validate_header, validate_table

    shipped = sorted(SHIPPED_DIR.glob("tuning-*.json"))
    assert shipped
    for path in shipped:
        assert validate_table(json.loads(path.read_text(encoding="utf-8"))) is None, path
    bad_row = _big_table(0)
    bad_row["groups"][0]["shapes"]["12288,7168"]["16"]["us"] = -1.0
    assert validate_header(bad_row) is None and validate_table(bad_row) is not None
    for broken in ({**bad_row, "schema": 1}, {**bad_row, "groups": {}}, {**bad_row, "moe": "x"}, []):
        assert validate_header(broken) is not None


def test_a_named_table_that_is_missing_is_warned_of(tmp_path: Path) -> None:
    """FP8SELECT_TUNING_TABLE naming no file (a typo) says so; the cache directory's table, missing, stays silent."""
    from fp8select.measured.sources import find_tables

    caps = Capabilities(device_kind="cuda", device_name=DEVICE,
                        env={"FP8SELECT_CACHE_DIR": str(tmp_path), "FP8SELECT_TUNING_TABLE": str(tmp_path / "typo.json")})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = find_tables(caps)
    assert [str(w.message) for w in caught] == [
        f"fp8select tuning table {str(tmp_path / 'typo.json')!r} (FP8SELECT_TUNING_TABLE) ignored: no such file"]
    assert [where for where, _ in found] == [str(table_path(SHIPPED_DIR, DEVICE))]


def test_resolve_reads_the_shipped_table_in_about_the_time_of_parsing_its_json() -> None:
    """The header check and the model's index (whose interpolation structures wait for the first shape no
    table holds) add little to the JSON parse: under 2x it (about 1.1x on a two-core CPU; a ratio in one
    process, not an absolute time)."""
    from fp8select.capabilities import Capabilities
    from fp8select.measured.sources import find_tables, measurements_for
    from fp8select.measured.table import SHIPPED_DIR

    path = SHIPPED_DIR / "tuning-nvidia-h200.json"
    caps = Capabilities(device_kind="cuda", device_name="NVIDIA H200", env={"FP8SELECT_CACHE_DIR": "/nonexistent"})

    parse = _fastest(lambda: json.loads(path.read_text(encoding="utf-8")))
    read = _fastest(lambda: measurements_for(caps, (), [t for _, t in find_tables(caps)]))
    assert read < 2 * parse
