"""Federated k-means (``fedkmeans``) against centralised k-means: the harness's ``smoke`` suite.

    python benchmarks/fedkmeans.py [--quick] [--seeds N] [--report]

Runs the suite (fedkmeans on the built-in planted-partition graph, 2 and 4
clients; :mod:`harness`), then renders the page docs/results/fedkmeans.md and
the scoreboard rows (benchmarks/results/scoreboard_fedkmeans.json) from
``benchmarks/results/smoke.json``; ``--report`` only renders them from the JSON.
fedkmeans has no paper: its rows' target is the centralised k-means it reproduces.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedgraphcore.config import ArgumentParser  # noqa: E402
from harness import get_suite, render_markdown, run_script, run_suite, suite_figures, value_arg  # noqa: E402
from pages import (ScoreRow, anchor, figure, paragraph, read_results, write_page,  # noqa: E402
                   write_scoreboard_rows)

SUITE = "smoke"
HEADING = "Federated vs centralised k-means on a planted-partition graph"
#: the centralised reference's agreement ARI a fedkmeans row needs to count as reproducing it
AGREEMENT_ARI = 0.9


def description() -> str:
    """The strategy's own description (the one ``python -m app.run describe fedkmeans`` prints)."""
    from app import registry

    return " ".join((inspect.getdoc(registry.STRATEGIES["fedkmeans"].strategy) or "").replace("``", "`").split())


def _mean(summary: dict, block: str, key: str) -> float | None:
    stat = (summary.get(block) or {}).get(key)
    return None if not stat else stat["mean"]


def score_rows(summary: dict) -> list[ScoreRow]:
    """One row per experiment: ACC against the centralised k-means; no paper figure, so no target."""
    rows = []
    for e in summary["experiments"]:
        s = e["summary"]
        acc, ref = _mean(s, "metrics", "acc"), _mean(s, "reference", "acc")
        ari, secs = _mean(s, "agreement", "ari"), _mean(s, "timing", "total_s")
        traffic = sum(v for v in (_mean(s, "communication", k) for k in ("bytes_up", "bytes_down")) if v)
        sd = (s.get("metrics") or {}).get("acc", {}).get("std")
        ours = "-" if acc is None else f"{100 * acc:.2f}" + (f" ± {100 * sd:.2f}" if sd else "")
        close = ari is not None and ari >= AGREEMENT_ARI
        rows.append(ScoreRow(
            method="fedkmeans", dataset=e["col"], metric="ACC %", paper="-", ours=ours,
            reference="-" if ref is None else f"{100 * ref:.2f}", time="-" if secs is None else f"{secs:.1f} s",
            traffic=f"{traffic:,.0f}", epsilon="none (no noise)", verdict="no target",
            why=f"no paper figure; agreement ARI with centralised k-means {ari:.3f}"
                + (f" (at least {AGREEMENT_ARI})" if close else f" (below {AGREEMENT_ARI})"),
            page="fedkmeans", anchor=anchor(HEADING)))
    return rows


def page() -> Path:
    """docs/results/fedkmeans.md and the scoreboard rows from smoke.json (the figures redrawn)."""
    suite = get_suite(SUITE)
    summary = read_results(f"{SUITE}.json", "python benchmarks/fedkmeans.py")
    figures = {Path(p).name: p for p in suite_figures(suite, summary)}
    write_scoreboard_rows("fedkmeans", score_rows(summary))
    quick = " --quick" if summary["quick"] else ""
    body = "\n\n".join([
        paragraph(description()),
        f"## {HEADING}",
        paragraph(f"`python benchmarks/fedkmeans.py{quick}`: the built-in attributed SBM (1,000 nodes, 4 blocks), "
                  "nodes split at random over the clients, every key at its default. The centralised reference "
                  "is k-means on the pooled features with the same seed."),
        render_markdown(suite, summary).strip(),
        *(figure(figures[name], caption) for name, caption in
          ((f"{SUITE}_bars.png", "federated and centralised accuracy"),
           (f"{SUITE}_embedding.png", "the clusters on a 2-D embedding of the graph")) if name in figures),
        paragraph("fedkmeans at its defaults on held-out data: [defaults](defaults.md); with secure aggregation "
                  "up to 2,000,000 nodes: [secure aggregation](secure-aggregation.md#secure-strategies-at-scale); "
                  "deployed: [deployment](deployment.md)."),
    ])
    return write_page("fedkmeans", "fedkmeans: federated k-means", body, "python benchmarks/fedkmeans.py --report")


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the suite's quick variant (one seed)")
    ap.add_argument("--seeds", type=value_arg(int, low=1), default=None, metavar="N", help="seeds 0..N-1")
    ap.add_argument("--report", action="store_true", help="only render the page from smoke.json")
    args = ap.parse_args(argv)
    if not args.report:
        seeds = None if args.seeds is None else range(args.seeds)
        run_suite(SUITE, quick=args.quick, seeds=seeds, plots=False)
    print(f"wrote {page()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
