"""A run's page opened as a reader opens it: in a browser (headless Chromium), offline.

One real run (in process, a 600-node planted-partition graph: large enough for the sampled view
and the cluster-level graph) writes its report.html; Chromium loads it from the file with every
network request recorded. The page must ask for nothing but itself and its inline ``data:``
images, log no console error or warning, decode every figure the page holds, show every section,
and leave a screenshot (kept in the test's folder; the README's is one). Chromium is the Debian
package ``chromium``, which ``make test-integration`` installs where it can; without one the test
is skipped, saying so.
"""

from __future__ import annotations

import re

import pytest

from app.run import run_experiment
from browser import find_browser, open_page

pytestmark = [pytest.mark.integration, pytest.mark.shipped_defaults]

SECTIONS = ["The run", "The clusters", "Federated, centralised and the truth", "Rounds",
            "Privacy ledger: what left each client", "Notes", "Settings"]


def test_a_runs_page_renders_offline_with_every_figure_and_no_console_error(tmp_path):
    if find_browser() is None:
        pytest.skip("no Chromium on this machine (the Debian package 'chromium'; make test-integration installs it "
                    "as root with apt-get)")
    out = tmp_path / "run"
    result = run_experiment("fedkmeans", "sbm", 3, {"sbm.nodes": 600, "num-rounds": 5}, out)
    html = (out / "report.html").read_text()
    drawn = re.findall(r'<img src="data:image/png;base64,', html)
    page = open_page(out / "report.html")
    assert page.console == []
    assert [u for u in page.requests if not u.startswith(("data:", "file:"))] == []  # offline: no network, no CDN
    assert [u for u in page.requests if u.startswith("file:")] == [(out / "report.html").as_uri()]
    assert len(page.images) == len(drawn) == 3  # the clusters, the cluster-level graph, the rounds
    assert all(i["complete"] and i["width"] > 100 and i["height"] > 100 for i in page.images), page.images
    assert page.headings == [f"fedkmeans on sbm"] + SECTIONS
    assert page.screenshot.startswith(b"\x89PNG") and len(page.screenshot) > 20_000
    (tmp_path / "report.png").write_bytes(page.screenshot)
    assert result["report"] == str(out / "report.html")
