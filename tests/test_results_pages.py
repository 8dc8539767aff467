"""The method pages of docs/results: each benchmark script re-renders its page, plots and scoreboard
rows from the committed JSON alone (its report mode), into a temporary report directory."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Lines outside tables stay readable on a narrow screen.
MAX_PROSE = 200
#: script, its report-mode arguments, page slug, and the (dataset, metric fragment) rows whose target is retired.
SCRIPTS = [
    ("kcagc.py", ["--report"], "kcagc", [("citeseer", "ACC")]),
    ("fedspectral.py", ["report"], "fedspectral", []),
    ("fedsc.py", ["--report"], "fedsc", []),
    ("gw_ldp.py", ["--report"], "gw-ldp", [("mutag", "GW_H*(GIN)"), ("proteins", "GW_H*(GIN)"),
                                          ("imdb-binary", "GW_H*(GIN)")]),
    ("fedavg_dmon.py", ["--report"], "fedavg-dmon", []),
    ("whole_graph.py", ["--report"], "whole-graph", []),
]


def _script(name: str):
    """A benchmark script as a module (the benchmarks directory is not a package)."""
    spec = importlib.util.spec_from_file_location(f"report_{Path(name).stem}", REPO / "benchmarks" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def rendered(request, tmp_path, monkeypatch):
    """Run a script's report mode with the report and scoreboard directories under ``tmp_path``."""
    name, argv, slug, _ = request.param
    module = _script(name)
    monkeypatch.setattr(module.pages, "REPORT_DIR", tmp_path / "docs")
    monkeypatch.setattr(module.pages, "IMAGE_DIR", tmp_path / "docs" / "img")
    monkeypatch.setattr(module.pages, "RESULTS_DIR", tmp_path)
    if name == "gw_ldp.py":  # its main reads sys.argv
        monkeypatch.setattr(sys, "argv", [name, *argv])
        assert module.main() == 0
    else:
        assert module.main(argv) == 0
    page = (tmp_path / "docs" / f"{slug}.md").read_text()
    rows = json.loads((tmp_path / f"scoreboard_{slug}.json").read_text())
    return request.param, page, rows, tmp_path / "docs", module.pages.anchor


@pytest.mark.parametrize("rendered", SCRIPTS, indirect=True, ids=[s[2] for s in SCRIPTS])
def test_report_mode_renders_the_page_from_the_committed_json(rendered):
    (name, argv, slug, retired), page, rows, docs, anchor = rendered
    lines = page.splitlines()
    assert lines[0].startswith("# ") and f"Regenerate: `python benchmarks/{name} {argv[0]}`" in page
    long = [line for line in lines if not line.startswith("|") and len(line) > MAX_PROSE]
    assert long == [], f"prose lines over {MAX_PROSE} characters"
    assert not re.search(r"20\d\d-\d\d-\d\d|\bsince\b|earlier version|issue \d", page)
    images = re.findall(r"!\[[^\]]*\]\((img/[^)]+\.png)\)", page)
    # regenerated into the temporary directory, or (the harness's plots) committed under docs/results/img
    assert images and all((docs / image).exists() or (REPO / "docs" / "results" / image).exists() for image in images)
    assert page == (REPO / "docs" / "results" / f"{slug}.md").read_text(), "committed page is stale"
    anchors = {anchor(line.lstrip("#")) for line in lines if line.startswith("#")}
    assert rows and all(r["page"] == slug and r["anchor"] in anchors for r in rows)
    assert all(r["verdict"] in ("met", "not met", "no target") and r["why"] for r in rows)
    retired_rows = [(r["dataset"], r["metric"]) for r in rows if r["why"].startswith("retired")]
    assert all(r["verdict"] == "no target" for r in rows if r["why"].startswith("retired"))
    assert len(retired_rows) == len(retired)
    assert all(any(d == ds and fragment in m for d, m in retired_rows) for ds, fragment in retired)
