"""The results report: ``docs/results/``, one page per method or topic and one scoreboard.

Every benchmark script renders its own page from the JSON it wrote under
``benchmarks/results/`` (so a page can be regenerated without re-running the
measurements), and hands its scoreboard rows to :func:`write_scoreboard_rows`;
``python benchmarks/scoreboard.py`` collects those rows into
``docs/results/README.md``. Figures are PNG files under ``docs/results/img/``,
embedded with :func:`figure`, so a forge's file browser shows them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
REPORT_DIR = REPO_ROOT / "docs" / "results"
IMAGE_DIR = REPORT_DIR / "img"
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"


@dataclass(frozen=True)
class ScoreRow:
    """One cell row of the scoreboard: a method on a dataset.

    Figures are strings as they should appear (``"72.4"``, ``"0.98 ARI"``, ``"-"``);
    ``page`` is the page slug and ``anchor`` the section heading anchor the row links to;
    ``verdict`` is ``"met"``, ``"not met"`` or ``"no target"``, and ``why`` one line.
    """

    method: str
    dataset: str
    metric: str
    paper: str
    ours: str
    reference: str
    time: str
    traffic: str
    epsilon: str
    verdict: str
    why: str
    page: str
    anchor: str = ""


def page_path(slug: str) -> Path:
    return REPORT_DIR / f"{slug}.md"


def write_page(slug: str, title: str, body: str, regenerate: str) -> Path:
    """Write ``docs/results/<slug>.md``: a title, how to regenerate it, then ``body`` (markdown)."""
    REPORT_DIR.mkdir(parents=True, exist_ok=True)
    text = f"# {title}\n\nRegenerate: `{regenerate}`. Back to the [scoreboard](README.md).\n\n{body.strip()}\n"
    path = page_path(slug)
    path.write_text(text)
    return path


def figure(path: Path | str, caption: str) -> str:
    """Markdown embedding a PNG under ``docs/results/img/`` (path relative to the page)."""
    rel = Path(path).resolve().relative_to(REPORT_DIR)
    return f"![{caption}]({rel.as_posix()})"


def image_path(name: str) -> Path:
    """Where a figure named ``name`` (e.g. ``kcagc_acc.png``) is saved."""
    IMAGE_DIR.mkdir(parents=True, exist_ok=True)
    return IMAGE_DIR / name


def read_results(name: str, measure: str) -> dict:
    """The JSON a benchmark wrote, ``benchmarks/results/<name>``; ``measure`` is the command that writes it,
    named in the one-line error when it is missing."""
    path = RESULTS_DIR / name
    if not path.is_file():
        raise SystemExit(f"error: {path} is missing; measure it first: `{measure}`")
    return json.loads(path.read_text())


def anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    keep = [c for c in heading.strip().lower() if c.isalnum() or c in " -_"]
    return "".join(keep).replace(" ", "-")


def table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def mean_spread(values: list[float], digits: int = 1, scale: float = 1.0) -> str:
    """``mean ± std`` of ``values`` times ``scale`` (sample standard deviation over seeds; the value
    alone for one run, ``-`` for none)."""
    xs = [scale * v for v in values if v is not None]
    if not xs:
        return "-"
    mean = sum(xs) / len(xs)
    if len(xs) == 1:
        return f"{mean:.{digits}f}"
    std = (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def seed_list(seeds: list[int]) -> str:
    """Seeds as a reader scans them: ``0-2`` for a run of consecutive seeds, else ``0, 3, 7``."""
    ordered = sorted(set(seeds))
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ", ".join(str(s) for s in ordered)


def write_scoreboard_rows(method: str, rows: list[ScoreRow]) -> Path:
    """Keep ``method``'s scoreboard rows (``benchmarks/results/scoreboard_<method>.json``)."""
    path = RESULTS_DIR / f"scoreboard_{method}.json"
    path.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    return path


def read_scoreboard_rows() -> list[ScoreRow]:
    """Every method's kept rows, in file-name order."""
    return [ScoreRow(**r) for p in sorted(RESULTS_DIR.glob("scoreboard_*.json")) for r in json.loads(p.read_text())]


def paragraph(text: str, width: int = 100) -> str:
    """``text`` as one markdown paragraph wrapped at ``width`` (never inside a word or a hyphenated
    name), so a page reads on a narrow screen and diffs line by line."""
    return textwrap.fill(" ".join(text.split()), width, break_long_words=False, break_on_hyphens=False)


def render_page_of(script: str) -> None:
    """Render the page ``benchmarks/<script>`` writes (its ``--report``: from the committed JSON) in a
    process of its own: a benchmark whose section stands on another script's page does not import
    that script, which imports the section."""
    subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / script), "--report"], check=True)
