"""The README and docs/: every relative link and heading anchor resolves, the README stays short,
its quickstart and set-up commands stay what they must be, and the strategy pages' key tables are
the registry's (scripts/strategy_pages.py)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from conftest import REPO
from pages import anchor

README = REPO / "README.md"
README_MAX_LINES = 200
PAGES = sorted([README, *(REPO / "docs").rglob("*.md")])
#: an inline link or image: [text](target) or [text](target "title")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+).*?\1")
SCHEME = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose_lines(text: str) -> list[str]:
    """The lines of a markdown text outside fenced code blocks, with inline code spans removed."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(INLINE_CODE.sub("", line))
    return lines


def heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors of ``path``'s headings: a repeated anchor gets ``-1``, ``-2``, ..."""
    seen: dict[str, int] = {}
    anchors = set()
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fenced or not match:
            continue
        base = anchor(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(1)))
        count = seen.get(base, 0)
        anchors.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return anchors


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file, or heading anchor, does not exist."""
    broken = []
    for line in prose_lines(page.read_text()):
        for target in LINK.findall(line):
            if SCHEME.match(target):
                continue
            name, _, fragment = target.partition("#")
            linked = (page.parent / name).resolve() if name else page
            if not linked.is_file() or not linked.is_relative_to(REPO):
                broken.append(target)
            elif fragment and linked.suffix == ".md" and fragment not in heading_anchors(linked):
                broken.append(target)
    return broken


def strategy_pages_module():
    spec = importlib.util.spec_from_file_location("strategy_pages", REPO / "scripts" / "strategy_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.M | re.S)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page):
    assert broken_links(page) == []


def test_the_link_check_finds_what_is_broken(tmp_path, monkeypatch):
    """The checker itself: a missing file, a missing anchor, a repeated heading's second anchor,
    a link in code (not a link) and an external link."""
    monkeypatch.setitem(globals(), "REPO", tmp_path)
    (tmp_path / "other.md").write_text("# Other page\n\n## Set-up: `make` & run\n\n## Set-up: `make` & run\n")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md) [b](other.md#other-page) [c](other.md#set-up-make--run-1)\n"
                    "[d](missing.md) [e](other.md#nowhere) [f](#here) [g](https://example.org/x.md)\n"
                    "`[h](missing-in-code.md)`\n```\n[i](missing-in-fence.md)\n```\n## Here\n"
                    "[j](../outside.md)\n")
    (tmp_path.parent / "outside.md").write_text("# Outside\n")
    assert broken_links(page) == ["missing.md", "other.md#nowhere", "../outside.md"]


def test_readme_fits_in_200_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/"


def test_readme_opens_with_the_two_set_up_commands_ci_runs():
    first_block = code_blocks(README.read_text(), "bash")[0]
    assert [line.split("#")[0].strip() for line in first_block.splitlines()] == ["make run", "make test"]
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^run:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_readme_links_every_docs_page_and_every_strategy_page():
    from app import registry

    text = README.read_text()
    linked = {(REPO / target.partition("#")[0]).resolve() for target in LINK.findall(text)}
    expected = {p.resolve() for p in (REPO / "docs").glob("*.md")}
    expected |= {(REPO / "docs" / "strategies" / f"{name}.md").resolve() for name in registry.STRATEGIES}
    expected.add((REPO / "docs" / "results" / "README.md").resolve())
    assert sorted(map(str, expected - linked)) == []


def test_quickstart_cli_and_python_use_one_git_ignored_folder():
    text = README.read_text()
    cli = "\n".join(code_blocks(text, "bash"))
    python = "\n".join(code_blocks(text, "python"))
    cli_folder = re.search(r"--dataset (\S+)", cli).group(1)
    python_folder = re.search(r"cluster\(\"[\w-]+\", \"([^\"]+)\"", python).group(1)
    assert cli_folder.rstrip("/") == python_folder.rstrip("/")
    assert f"mkdir -p {cli_folder}" in cli
    ignored = {line.strip().strip("/") for line in (REPO / ".gitignore").read_text().splitlines()}
    assert cli_folder.strip("/") in ignored, f"{cli_folder} is not in .gitignore"


def test_readme_and_docs_name_only_the_pinned_flower_version():
    """Outside docs/results/ (measurement records, each naming what it measured with)."""
    pinned = re.search(r'"flwr\[simulation\]>=(\d+\.\d+)', (REPO / "pyproject.toml").read_text()).group(1)
    for page in PAGES:
        if (REPO / "docs" / "results") in page.parents:
            continue
        versions = set(re.findall(r"(?:Flower|flwr)\s+(\d+\.\d+)", page.read_text()))
        assert versions <= {pinned}, (page.name, versions)


def test_every_strategy_has_a_page_whose_key_table_is_the_registrys():
    from app import registry

    pages = strategy_pages_module()
    assert sorted(p.stem for p in pages.PAGES.glob("*.md")) == sorted(registry.STRATEGIES)
    for name in registry.STRATEGIES:
        text = (pages.PAGES / f"{name}.md").read_text()
        assert pages.page_text(name, text) == text, f"run python scripts/strategy_pages.py ({name}.md is stale)"
        for param in (*registry.get(name).strategy.params, *registry.get(name).strategy.borrowed):
            assert f"| `{param.key}`" in text


def test_the_generator_replaces_only_its_part():
    pages = strategy_pages_module()
    page = f"# fedsc\n\nhand-written\n\n{pages.BEGIN}\nstale\n{pages.END}\n\nafter\n"
    text = pages.page_text("fedsc", page)
    assert text.startswith("# fedsc\n\nhand-written\n\n") and text.endswith("\n\nafter\n")
    assert "stale" not in text and "| `fedsc.sigma`" in text
    with pytest.raises(SystemExit, match="no generated part"):
        pages.page_text("fedsc", "# fedsc\n")
