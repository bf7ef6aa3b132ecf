"""Every pointer a reader may follow resolves: the links of README.md and docs/*.md (files and #anchors of
their headings, as GitHub renders them), the repository paths they name in code spans, and the files and
anchors that the command line's help texts point to (tests/test_cli_help.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# a path into the repository's own folders (not results/, data/ or a build's outputs)
REPO_PATH = re.compile(
    r"(?<![\w/.<-])((?:docs|config|tests|src|workflow|notebooks|benchmarks|profiles|assets|\.ci)/"
    r"[\w./-]*[\w/])(?![\w/<{*-]|\.\w)(#[\w-]+)?"
)
PLACEHOLDER = re.compile(r"[a-z]N\.")  # figN.rst: any figure's


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (not hyphens), spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(document: Path) -> set[str]:
    found, seen = set(), {}
    in_code = False
    for line in document.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (match := re.match(r"#{1,6} (.+)", line)):
            base = slug(match.group(1))
            count = seen.get(base, 0)
            found.add(base if count == 0 else f"{base}-{count}")
            seen[base] = count + 1
    return found


def unresolved(target: str, base: Path) -> str | None:
    """Why ``target`` (a path relative to ``base``, maybe with #anchor) does not resolve; None if it does."""
    path_text, _, anchor = target.partition("#")
    path = (base / path_text).resolve() if path_text else None
    if path is not None and not path.exists():
        return f"{target}: no such file"
    document = path if path is not None else None
    if anchor and document is not None and document.suffix == ".md" and anchor not in anchors(document):
        return f"{target}: no heading with anchor #{anchor} in {document.name}"
    return None


def pointers_of(text: str, *, links: bool) -> list[str]:
    """Relative link targets (when ``links``) and repository paths named anywhere in ``text``."""
    found = []
    if links:
        found += [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]
    for match in REPO_PATH.finditer(text):
        if not PLACEHOLDER.search(match.group(1)):
            found.append(match.group(1) + (match.group(2) or ""))
    return found


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_links_and_paths_of_the_docs_resolve(document):
    text = document.read_text(encoding="utf-8")
    problems = []
    for target in pointers_of(text, links=True):
        is_link = f"]({target})" in text
        if target.startswith("#"):
            problem = unresolved(target, document.parent) if is_link else None
            problem = problem or (None if target[1:] in anchors(document) else f"{target}: no such heading")
        else:
            base = document.parent if is_link else REPO
            problem = unresolved(target, base)
        if problem:
            problems.append(problem)
    assert not problems, f"{document.relative_to(REPO)}: " + "; ".join(sorted(set(problems)))


def test_the_checker_sees_a_broken_pointer(tmp_path):
    """A missing file, a missing anchor and a good anchor, told apart."""
    (tmp_path / "a.md").write_text("# Read a build's tables\n## 6.1 What a command may write\n")
    assert unresolved("a.md#read-a-builds-tables", tmp_path) is None
    assert unresolved("a.md#61-what-a-command-may-write", tmp_path) is None
    assert "no heading" in unresolved("a.md#tables", tmp_path)
    assert "no such file" in unresolved("b.md", tmp_path)
    assert pointers_of("see docs/whole_model.md and `config/x.yaml`.", links=False) == [
        "docs/whole_model.md",
        "config/x.yaml",
    ]
