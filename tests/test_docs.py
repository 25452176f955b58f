"""The documentation holds together (no GPU): every relative link of README.md and docs/*.md reaches a file
(and a heading, for a link with an anchor), the README's example runs, its figures are the ones
docs/performance.md gives and benchmarks/results/ holds, every JSON file a page quotes is kept, and the
alias table names every alias."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RESULTS = ROOT / "benchmarks" / "results"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _prose(text: str) -> str:
    """The text without fenced code blocks (a link inside one is code, not a link)."""
    return FENCE.sub("", text)


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lowercase, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(page.read_text(encoding="utf-8")).splitlines():
        if match := re.match(r"#{1,6} (.+)", line):
            slug = _slug(match.group(1))
            out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return out


def _links(page: Path) -> list[str]:
    return [t for t in LINK.findall(_prose(page.read_text(encoding="utf-8"))) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_reaches_a_file_and_heading(page: Path) -> None:
    for link in _links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name}: {link} -> no such file"
        assert ROOT in target.parents or target == ROOT, f"{page.name}: {link} leaves the repository"
        if anchor:
            assert target.suffix == ".md" and anchor in _anchors(target), f"{page.name}: {link} -> no such heading"


def test_the_slug_is_githubs() -> None:
    assert _slug("The CLI (`fp8select explain ...`, `bench`, `tune`)") == "the-cli-fp8select-explain--bench-tune"
    assert _slug("Failures at run time, not input") == "failures-at-run-time-not-input"


def test_the_readme_reads_in_five_minutes() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    assert all(page.name in readme for page in PAGES if page.parent.name == "docs" and page.name != "history.md")


def _example() -> str:
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## Example", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    return code


def test_the_readmes_example_runs_on_a_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "FP8SELECT_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", _example()], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torch.Size([4, 2112]) torch.bfloat16" in proc.stdout and proc.stdout.rstrip().endswith("True")


def _summary(name: str) -> dict:
    summary: dict = json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))["summary"]
    return summary


def test_the_readmes_figures_are_performance_mds_and_the_results() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    performance = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    vendors, alone = _summary("regret_vendors_deepseek"), _summary("regret_novendors_deepseek")
    figures = [f"{vendors['auto_regret_geomean']:.3f}", f"{vendors['auto_regret_worst']:.3f}",
               f"{alone['auto_regret_geomean']:.3f}", f"{alone['auto_regret_worst']:.3f}",
               *(f"{vendors['ideal_vs_always'][b]:.2f}x" for b in ("deepgemm", "triton", "cuda-scaled-mm")),
               f"{alone['ideal_vs_always']['triton']:.2f}x"]
    assert figures == ["0.999", "1.012", "1.000", "1.008", "1.08x", "1.14x", "1.28x", "1.06x"]  # the kept results
    for text in (readme, performance):
        for figure in figures:
            assert figure in text, figure
    assert f"{_summary('regret_vendors_other_model')['auto_regret_worst']:.3f}" in performance


def test_performance_md_and_the_readme_quote_the_kept_model_check() -> None:
    """The model's figures for shapes in no table are benchmarks/results/model_check.json's (which a test
    of tests/test_benchmark_reports.py checks the tool computes from the shipped table)."""
    performance = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    kept = json.loads((RESULTS / "model_check.json").read_text(encoding="utf-8"))
    for label, other in (("all", "vendors"), ("without vendors", "novendors")):
        for fold in ("leave_one_shape_out", "leave_one_model_out", "10_rows_measured", "20_rows_measured", "30_rows_measured",
                     "leave_one_bucket_out", "no_table_10_rows", "no_table_20_rows", "no_table_30_rows",
                     f"results/regret_{other}_other_model.json", f"results/regret_{other}_unseen_model.json",
                     f"results/regret_{other}_glm_model.json"):
            s = kept[label][fold]
            row = f"{s['geomean']:.3f}, {s['worst']:.3f}; {s['vs_single_geomean']:.3f}, {s['vs_single_worst']:.3f}"
            assert row in performance, (label, fold, row)
    with_, without = kept["all"]["leave_one_shape_out"], kept["without vendors"]["leave_one_shape_out"]
    assert (f"within {100 * (with_['geomean'] - 1):.1f}% on average ({100 * (without['geomean'] - 1):.1f}% without the "
            f"vendors), but up to {with_['worst']:.2f}x off at single points ({without['worst']:.2f}x without)") in readme


NOT_RESULTS = {"config.json", "verified.json"}
"""Files the pages name that are not kept results: a model's Hugging Face configuration, the cache's record."""


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_json_a_page_quotes_is_kept(page: Path) -> None:
    """A quoted ``name.json`` is a kept result; a quoted path is a file of the repository."""
    quoted = set(re.findall(r"`([\w*./-]+\.json)`", page.read_text(encoding="utf-8"))) - NOT_RESULTS
    missing = [name for name in quoted if not list((ROOT if "/" in name else RESULTS).glob(name))]
    assert not missing, missing


def test_the_alias_table_names_every_alias() -> None:
    from fp8select.names import ALIASES

    concepts = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
    for alias in ALIASES:
        assert f"`{alias}`" in concepts, alias


def test_moe_md_quotes_the_kept_moe_model_check() -> None:
    moe = (ROOT / "docs" / "moe.md").read_text(encoding="utf-8")
    kept = json.loads((RESULTS / "moe_model_check.json").read_text(encoding="utf-8"))
    for fold in ("leave_one_shape_out", "leave_one_model_out"):
        summary = kept[fold]["summary"]
        for name in ("model", "rule", "always"):
            assert f"{summary[name]['geomean']:.3f}, {summary[name]['worst']:.3f}" in moe, (fold, name)
