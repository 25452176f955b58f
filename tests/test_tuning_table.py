"""The tuning table on disk: bad files are ignored with one warning, writes are atomic."""

from __future__ import annotations

import json
import multiprocessing
import warnings
from pathlib import Path
from typing import Any

import pytest

from fp8select.tuning_cache import (
    SCHEMA,
    TuningCacheWarning,
    cache_dir,
    fingerprint,
    load_table,
    new_table,
    save_table,
    table_path,
    validate_table,
)

VERSIONS = {"torch": "2.11.0+cu130", "triton": "3.6.0"}
DEVICE = "NVIDIA H200"


def _table(device: str = DEVICE, versions: dict[str, str] | None = None, writer: int = 0) -> dict[str, Any]:
    table = new_table(device, versions or VERSIONS)
    table["entries"] = {
        "12288,7168": {"16": {"backend": "cuda-scaled-mm", "config": None, "us": 33.3 + writer},
                       "4096": {"backend": "triton", "config": {"BLOCK_M": 128, "writer": writer}, "us": 627.0}},
        "2112,7168": {"1": {"backend": "triton", "config": {"SPLIT_K": 4}, "us": 14.3}},
    }
    return table


def _load(path: Path, table: dict[str, Any] | None = None, **kw: Any) -> tuple[dict[str, Any] | None, list[str]]:
    expected = (table or _table())["fingerprint"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = load_table(path, expected, **kw)
    return result, [str(w.message) for w in caught if issubclass(w.category, TuningCacheWarning)]


def test_round_trip(tmp_path: Path) -> None:
    table = _table()
    path = table_path(tmp_path / "sub" / "dir", table["fingerprint"])
    save_table(path, table)
    loaded, caught = _load(path)
    assert loaded == table and caught == []
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")], "temporary file left behind"


def test_missing_file_is_a_silent_cold_cache(tmp_path: Path) -> None:
    assert _load(tmp_path / "nope.json") == (None, [])


def test_fingerprint_depends_on_every_input() -> None:
    base = fingerprint(DEVICE, "2.11.0", "3.6.0", {"deep_gemm": "2.1.1"})
    assert base == fingerprint(DEVICE, "2.11.0", "3.6.0", {"deep_gemm": "2.1.1"})
    others = {
        fingerprint("NVIDIA H100", "2.11.0", "3.6.0", {"deep_gemm": "2.1.1"}),
        fingerprint(DEVICE, "2.12.0", "3.6.0", {"deep_gemm": "2.1.1"}),
        fingerprint(DEVICE, "2.11.0", None, {"deep_gemm": "2.1.1"}),
        fingerprint(DEVICE, "2.11.0", "3.6.0", {"deep_gemm": "2.1.2"}),
        fingerprint(DEVICE, "2.11.0", "3.6.0", {}),
    }
    assert base not in others and len(others) == 5


def _write_text(path: Path, text: str | bytes) -> None:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())


GOOD = json.dumps(_table(), indent=1)

BAD_FILES: dict[str, tuple[str | bytes, str]] = {
    "truncated": (GOOD[: len(GOOD) // 2], "truncated"),
    "truncated-one-char": (GOOD.rstrip()[:-1], "truncated"),
    "empty": ("", "truncated"),
    "garbage": ("{\"schema\": 1, nonsense}", "corrupt"),
    "binary": (b"\xff\xfe\x00garbage", "not UTF-8"),
    "not-an-object": ("[1, 2, 3]", "expected a JSON object"),
    "other-schema": (json.dumps({**_table(), "schema": 2}), "schema: expected 1, found 2"),
    "missing-entries": (json.dumps({k: v for k, v in _table().items() if k != "entries"}), "missing entries"),
    "bad-shape-key": (json.dumps({**_table(), "entries": {"12288x7168": {}}}), "'N,K'"),
    "bad-bucket": (json.dumps({**_table(), "entries": {"1,1": {"3": {"backend": "x", "config": None, "us": 1.0}}}}),
                   "power-of-two"),
    "nan-time": (json.dumps({**_table(), "entries": {"1,1": {"4": {"backend": "x", "config": None, "us": float("nan")}}}}),
                 ".us"),
    "bad-config": (json.dumps({**_table(), "entries": {"1,1": {"4": {"backend": "x", "config": [1], "us": 1}}}}), ".config"),
    "other-device": (json.dumps(_table(device="NVIDIA B200")), "another device"),
    "other-torch": (json.dumps(_table(versions={"torch": "2.10.0", "triton": "3.6.0"})), "another torch"),
    "other-triton": (json.dumps(_table(versions={"torch": "2.11.0+cu130", "triton": "3.5.0"})), "other package versions"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_tables_are_ignored_with_one_warning(tmp_path: Path, case: str) -> None:
    content, fragment = BAD_FILES[case]
    path = tmp_path / "table.json"
    _write_text(path, content)
    loaded, caught = _load(path, device_name=DEVICE, versions=VERSIONS)
    assert loaded is None
    assert len(caught) == 1, caught
    assert fragment in caught[0] and str(path) in caught[0]


def test_mismatch_without_context_names_the_fingerprints(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    save_table(path, _table(device="NVIDIA B200"))
    loaded, caught = _load(path)
    assert loaded is None and len(caught) == 1 and "fingerprint mismatch" in caught[0]


def test_directory_in_place_of_the_file(tmp_path: Path) -> None:
    (tmp_path / "t.json").mkdir()
    loaded, caught = _load(tmp_path / "t.json")
    assert loaded is None and len(caught) == 1 and "unreadable" in caught[0]


def test_save_rejects_a_malformed_table(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="schema"):
        save_table(tmp_path / "t.json", {**_table(), "schema": 7})
    with pytest.raises(ValueError, match="us"):
        save_table(tmp_path / "t.json", {**_table(), "entries": {"1,1": {"4": {"backend": "x", "config": None, "us": -1}}}})
    assert not list(tmp_path.iterdir()), "nothing may be written for a rejected table"


def test_new_table_needs_a_torch_version() -> None:
    with pytest.raises(ValueError, match="versions"):
        new_table(DEVICE, {"triton": "3.6.0"})
    assert validate_table(new_table(DEVICE, VERSIONS)) is None
    assert new_table(DEVICE, VERSIONS)["schema"] == SCHEMA


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
        table["entries"][f"{n},7168"] = {str(1 << b): {"backend": "triton", "config": {"BLOCK_M": 64}, "us": float(n + b)}
                                         for b in range(4)}
    return table


ROUNDS = 15


def _writer(path: str, writer: int, rounds: int) -> None:
    for i in range(rounds):
        save_table(path, _big_table(writer * 1000 + i))


def _reader(path: str, rounds: int, queue: Any) -> None:
    bad = 0
    expected = _table()["fingerprint"]
    for _ in range(rounds):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            table = load_table(path, expected)
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
    writer = loaded["entries"]["12288,7168"]["4096"]["config"]["writer"]
    assert writer % 1000 == ROUNDS - 1, "the last complete table of some writer is what remains"
    assert not [p.name for p in path.parent.iterdir() if p.name != "table.json"], "temporary files left behind"
