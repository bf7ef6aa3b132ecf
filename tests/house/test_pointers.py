"""Every pointer a reader may follow resolves: the links of README.md and docs/*.md (files and #anchors of
their headings, as GitHub renders them), the repository paths they name in code spans, the files and
anchors that the command line's help texts point to (tests/cli/test_cli_help.py), and the dotted module paths
(``attnid.x.y``) that the docs, pyproject.toml and the package's docstrings and comments name."""

from __future__ import annotations

import importlib
import io
import re
import tokenize
from pathlib import Path

import pytest
from doc_pointers import DOCUMENTS, REPO, anchors, pointers_of, unresolved


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


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_the_docs_hold_no_control_characters(document):
    # a LaTeX command written through a non-raw Python string loses its backslash to an escape ("\to" as a
    # tab and "o", "\frac" as a form feed and "rac"), which a reader sees as a broken formula
    lines = document.read_text(encoding="utf-8").split("\n")  # not splitlines: it splits at \f
    broken = [n for n, line in enumerate(lines, 1) if re.search(r"[\x00-\x08\x0b-\x1f\t]", line)]
    assert not broken, f"control characters on lines {broken}"


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


# --------------------------------------------------------------------------------------
# dotted module paths: attnid.x.y named in the docs and the package's docstrings and comments
# --------------------------------------------------------------------------------------

DOTTED = re.compile(r"(?<![\w./-])attnid(?:\.[A-Za-z_]\w*)+")
FILE_SUFFIXES = {"yaml", "yml", "json", "csv", "md", "py", "toml", "txt", "tex", "pdf", "png", "j2", "rst"}
SOURCES = sorted((REPO / "src" / "attnid").rglob("*.py"))


def resolves(dotted: str) -> bool:
    """Whether ``attnid.a.b.c`` is a module, or an attribute (a class, function, constant, method) of one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as err:
            if err.name and ".".join(parts[:cut]).startswith(err.name):
                continue
            raise
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


def dotted_paths(text: str) -> list[str]:
    """The ``attnid.x.y`` names of ``text``, less file names (``attnid.yaml``)."""
    found = [match.rstrip(".") for match in DOTTED.findall(text)]
    return [name for name in found if name.rsplit(".", 1)[-1] not in FILE_SUFFIXES]


def docstrings_and_comments(path: Path) -> str:
    """Every string literal and comment of a Python source: its docstrings, comments and messages."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    return "\n".join(token.string for token in tokens if token.type in (tokenize.STRING, tokenize.COMMENT))


@pytest.mark.parametrize(
    "document",
    [*DOCUMENTS, REPO / "pyproject.toml", *SOURCES],
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_module_paths_named_resolve(document):
    text = (
        document.read_text(encoding="utf-8")
        if document.suffix != ".py"
        else docstrings_and_comments(document)
    )
    stale = sorted({name for name in dotted_paths(text) if not resolves(name)})
    assert not stale, f"{document.relative_to(REPO)} names what is not there: {stale}"


def test_the_module_path_checker_tells_stale_from_live():
    text = ":mod:`attnid.model.layout`, attnid.theory.shape.LayerShape, not attnid.statistics: attnid.yaml"
    names = dotted_paths(text)
    assert names == ["attnid.model.layout", "attnid.theory.shape.LayerShape", "attnid.statistics"]
    assert [resolves(name) for name in names] == [True, True, False]
