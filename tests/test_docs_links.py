"""The documentation stays findable and self-contained.

Rules kept by these tests:

- every relative link in README.md and docs/*.md points to an existing file, and its ``#anchor`` to a heading
  (GitHub's anchor rules) or an ``<a id>`` of that file;
- every reference from code and docs to a docs page section (``docs/formats.md#ncu-numbers``, ``formats.md#...``,
  ``docs/field-cases.md C15``, ``DESIGN.md §3``) names a section that exists;
- nothing in the repository points to the format notes kept beside it (``../shared/docs/...``: what a reader
  needs from there is written into docs/formats.md and docs/field-cases.md) or to an issue number (the issue
  tracker is not part of the repository; say what the change was instead). Tests may read real recorded data
  from ``../shared/data/real`` (test input, not documentation), and ``tests/test_ncu_catalog.py`` reads the
  shared ncu notes as the spelling authority for metric names.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

# Where the shared-notes rule and the issue-number rule apply (tests/ only for issue numbers, see above).
NO_SHARED_NOTES = ["src", "scripts", "workflow", "docs", "benchmarks", "profiles", "config", "README.md", "Snakefile",
                   "pyproject.toml"]
NO_ISSUE_NUMBERS = [*NO_SHARED_NOTES, "tests"]
TEXT_SUFFIXES = {".py", ".md", ".smk", ".yaml", ".yml", ".toml", ".rst", ".txt", ".json", ""}

SHARED_NOTES = re.compile(r"shared/docs|(?<![\w-])(?:cases|ncu|nsys-sqlite|kineto-and-inductor|snakemake)\.md\b")
ISSUE_NUMBER = re.compile(r"\b[Ii]ssues?\s*#?\s*\d+")
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
# docs/formats.md#a, #b  |  formats.md#a  (a page of docs/ named without the folder)
PAGE_REF = re.compile(r"(?<![\w.-])(docs/)?([\w-]+\.md)((?:#[\w-]+)(?:, #[\w-]+)*)")
DOCS_FILE = re.compile(r"(?<![\w./-])docs/([\w-]+\.md)")
CASE_REF = re.compile(r"field-cases\.md`{0,2} (C\d\d)\b")
DESIGN_REF = re.compile(r"DESIGN\.md`{0,2} §(\d+)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation (including backticks) dropped, spaces -> '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text))
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        found.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return frozenset(found)


def files(roots: list[str]) -> list[Path]:
    out = []
    for name in roots:
        path = ROOT / name
        if path.is_file():
            out.append(path)
        elif path.is_dir():
            out += [p for p in sorted(path.rglob("*")) if p.is_file() and p.suffix in TEXT_SUFFIXES
                    and "__pycache__" not in p.parts]
    return [p for p in out if p != Path(__file__).resolve()]


def lines_matching(pattern: re.Pattern, roots: list[str]) -> list[str]:
    hits = []
    for path in files(roots):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return hits


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 150


def test_slug_follows_github():
    assert slug("`report.html`") == "reporthtml"
    assert slug("Running on a cluster (SLURM)") == "running-on-a-cluster-slurm"
    assert slug("emit_nvtx range names") == "emit_nvtx-range-names"
    assert slug("1. Harness") == "1-harness"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading or anchor '{anchor}' in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_references_to_docs_sections_resolve():
    broken = []
    for path in files(NO_ISSUE_NUMBERS):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        where = path.relative_to(ROOT)
        for name in DOCS_FILE.findall(text):
            if not (DOCS / name).exists():
                broken.append(f"{where}: docs/{name} does not exist")
        for prefix, name, refs in PAGE_REF.findall(text):
            page = DOCS / name
            if not page.exists():
                if prefix:
                    broken.append(f"{where}: docs/{name} does not exist")
                continue
            for anchor in re.findall(r"#([\w-]+)", refs):
                if anchor not in anchors(page):
                    broken.append(f"{where}: {name}#{anchor}")
        for case in CASE_REF.findall(text):
            if case.lower() not in anchors(DOCS / "field-cases.md"):
                broken.append(f"{where}: field case {case} is not in docs/field-cases.md")
        for section in DESIGN_REF.findall(text):
            if not re.search(rf"^## {section}\. ", (DOCS / "DESIGN.md").read_text(encoding="utf-8"), re.M):
                broken.append(f"{where}: DESIGN.md §{section} does not exist")
    assert not broken, "\n".join(broken)


def test_the_rule_patterns_catch_what_they_are_for():
    assert SHARED_NOTES.search("see ../shared/docs/ncu.md §2") and SHARED_NOTES.search("(cases.md C15)")
    assert not SHARED_NOTES.search("docs/field-cases.md C15") and not SHARED_NOTES.search("../shared/data/real/ncu")
    for text in ("(issue #6 item 4)", "Issue 14: ...", "issues 13", "the crash of issue #13"):
        assert ISSUE_NUMBER.search(text), text
    for text in ("pytorch/kineto#843", "https://github.com/pytorch/kineto/issues/843", "PR #873", "an issue"):
        assert not ISSUE_NUMBER.search(text), text


def test_nothing_points_to_the_shared_notes():
    hits = lines_matching(SHARED_NOTES, NO_SHARED_NOTES)
    assert not hits, "write what the reader needs into docs/formats.md or docs/field-cases.md:\n" + "\n".join(hits)


def test_nothing_points_to_an_issue_number():
    hits = lines_matching(ISSUE_NUMBER, NO_ISSUE_NUMBERS)
    assert not hits, "say what the change was instead of its issue number:\n" + "\n".join(hits)
