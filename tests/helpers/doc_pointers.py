"""Where a reader's pointers lead: links and #anchors of the Markdown docs, as GitHub renders them, and the
repository paths named in their code spans (tests/house/test_pointers.py, tests/cli/test_cli_help.py)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
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
