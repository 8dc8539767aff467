"""The scoreboard: ``docs/results/README.md``, one page over every method's kept rows.

    python benchmarks/scoreboard.py

Collects the rows each method's benchmark script keeps (``benchmarks/results/scoreboard_<method>.json``,
:func:`pages.write_scoreboard_rows`) into one table, method x dataset: metric, the paper's figure, ours,
the centralised reference's, time, traffic and epsilon, each row linking to its page section; then one
line per row, met or not and why; then the report's other pages. Runs nothing: re-run a method's script
(or its report mode) to change its rows.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pages  # noqa: E402
from pages import ScoreRow, paragraph, table  # noqa: E402

HEADER = ["method", "dataset", "metric", "paper", "ours", "centralised", "time", "traffic (bytes)", "epsilon"]


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def link(row: ScoreRow) -> str:
    """The row's method, linked to its page section (relative to docs/results/)."""
    return f"[{row.method}]({row.page}.md" + (f"#{row.anchor}" if row.anchor else "") + ")"


def page_title(path: Path) -> str:
    first = path.read_text().split("\n", 1)[0]
    return first[2:].strip() if first.startswith("# ") else path.stem


def render(rows: list[ScoreRow], page_paths: list[Path]) -> str:
    """The scoreboard's markdown: the table, the verdicts, the pages no row links to."""
    linked = {r.page for r in rows}
    others = [p for p in page_paths if p.stem not in linked and p.name != "README.md"]
    table_rows = [[link(r), *(_cell(v) for v in (r.dataset, r.metric, r.paper, r.ours, r.reference, r.time,
                                                  r.traffic, r.epsilon))] for r in rows]
    verdicts = [textwrap.fill(f"- {link(r)}, {_cell(r.dataset)}: **{r.verdict}**, {_cell(r.why)}", 100,
                              subsequent_indent="  ", break_long_words=False, break_on_hyphens=False) for r in rows]
    parts = [
        "# Results",
        paragraph("Every method against its paper and against the centralised method it approximates, on the "
                  "same data. paper = the published figure; ours = this implementation (mean ± std over seeds "
                  "where several ran); centralised = the centralised reference on the same data and seed; time = "
                  "seconds per run; traffic = bytes up and down per run; epsilon = the privacy budget the run "
                  "reports (none where nothing is noised). Each method links to the section of its page the row "
                  "comes from."),
        paragraph("Regenerate: `python benchmarks/scoreboard.py` (from `benchmarks/results/scoreboard_*.json`, "
                  "which each method's benchmark script writes; every page says how to regenerate it)."),
        table(HEADER, table_rows) if rows else "No method has written its rows yet.",
        "## Met or not",
        "\n".join(verdicts) if verdicts else "-",
    ]
    if others:
        parts += ["## Other pages", "\n".join(f"- [{page_title(p)}]({p.name})" for p in others)]
    return "\n\n".join(parts) + "\n"


def write_scoreboard() -> Path:
    pages.REPORT_DIR.mkdir(parents=True, exist_ok=True)
    path = pages.REPORT_DIR / "README.md"
    path.write_text(render(pages.read_scoreboard_rows(), sorted(pages.REPORT_DIR.glob("*.md"))))
    return path


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print(f"wrote {write_scoreboard()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
