"""The house rules that keep the package's structure readable (docs/design.md §6):

- the layers import only the layers below them (import-linter's contract in pyproject.toml);
- no name is defined at the top level of two modules (one owner per concept);
- the module map of docs/design.md §6 lists exactly the modules on disk;
- the library prints nothing: argparse and output live in attnid.cli;
- every public function and method has annotated parameters and return type (mypy checks them).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

import attnid

PACKAGE = Path(attnid.__file__).resolve().parent
MODULES = sorted(path for path in PACKAGE.rglob("*.py"))


def _top_level_names(path: Path) -> list[str]:
    names = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [target.id for target in node.targets if isinstance(target, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [name for name in names if not name.startswith("__")]


def test_the_layers_import_only_the_layers_below_them(repo_root):
    result = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"],
        cwd=repo_root,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(PACKAGE.parent), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "1 kept, 0 broken" in result.stdout


def test_a_broken_layer_is_caught(repo_root, tmp_path):
    """The contract can fail: a copy of the package whose theory imports the model breaks it."""
    import shutil

    copy = tmp_path / "src" / "attnid"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "theory" / "counts.py").write_text(
        (copy / "theory" / "counts.py").read_text() + "\nfrom attnid.model import gpt  # noqa\n"
    )
    shutil.copy(repo_root / "pyproject.toml", tmp_path / "pyproject.toml")
    result = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode != 0 and "attnid.theory.counts -> attnid.model.gpt" in result.stdout


# A registry's modules each define the names of its protocol (attnid.reports.figures: one module per figure).
PROTOCOL_NAMES = {"reports/figures/fig*.py": {"INPUTS", "STAGE", "CAPTION", "draw"}}


def test_no_name_is_defined_in_two_modules():
    owners = defaultdict(list)
    for path in MODULES:
        where = path.relative_to(PACKAGE)
        protocol = {
            name for pattern, names in PROTOCOL_NAMES.items() if where.match(pattern) for name in names
        }
        for name in _top_level_names(path):
            if name not in protocol:
                owners[name].append(str(where))
    clashes = {name: where for name, where in owners.items() if len(where) > 1}
    assert not clashes, clashes


def _module_map(repo_root: Path) -> list[str]:
    design = (repo_root / "docs" / "design.md").read_text(encoding="utf-8")
    section = design[design.index("## 6. ") : design.index("## 7. ")]
    return re.findall(r"^\s*\|[^|]*\| `([\w/]+\.py)` \|", section, flags=re.M)


def test_the_module_map_lists_every_module_once(repo_root):
    listed = _module_map(repo_root)
    on_disk = sorted(
        str(path.relative_to(PACKAGE))
        for path in MODULES
        if path.name != "__init__.py" or path.parent.name == "cli"
    )
    on_disk = [name for name in on_disk if name != "__main__.py"]
    assert len(listed) == len(set(listed)), sorted({name for name in listed if listed.count(name) > 1})
    assert sorted(listed) == on_disk, {
        "not on disk": sorted(set(listed) - set(on_disk)),
        "not in docs/design.md §6": sorted(set(on_disk) - set(listed)),
    }


def test_every_subpackage_says_what_it_owns_and_what_it_may_import():
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        if init.parent.name == "cli":
            continue
        docstring = " ".join((ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or "").split())
        assert "May import" in docstring or "Imports no other layer" in docstring, init


@pytest.mark.parametrize(
    "path",
    [p for p in MODULES if "cli" not in p.relative_to(PACKAGE).parts],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_only_the_command_line_parses_arguments(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert "argparse" not in imported, (
        f"{path.name} imports argparse: command-line code belongs in attnid.cli"
    )


def _unannotated_public_defs(tree: ast.Module) -> list[str]:
    """``name(missing parameters) -> ?`` of each public function or method (of a public class) that lacks
    an annotation; ``self`` and ``cls`` need none, and names with a leading underscore are not checked."""
    found = []
    scopes: list[tuple[str, ast.AST]] = [("", tree)]
    while scopes:
        prefix, scope = scopes.pop()
        for node in ast.iter_child_nodes(scope):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                scopes.append((f"{prefix}{node.name}.", node))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                args = node.args
                params = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
                missing = [
                    a.arg
                    for i, a in enumerate(params)
                    if a is not None
                    and a.annotation is None
                    and not (prefix and i == 0 and a.arg in ("self", "cls"))
                ]
                if missing or node.returns is None:
                    found.append(
                        f"{prefix}{node.name}({', '.join(missing)}){' -> ?' if node.returns is None else ''}"
                    )
    return found


def test_every_public_function_is_annotated():
    offenders = {
        str(path.relative_to(PACKAGE)): names
        for path in MODULES
        if (names := _unannotated_public_defs(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert not offenders, f"public functions without annotations: {offenders}"


def test_an_unannotated_public_function_is_caught():
    tree = ast.parse(
        "def shown(x, y: int): ...\nclass C:\n    def m(self, z) -> None: ...\ndef _hidden(a): ..."
    )
    assert _unannotated_public_defs(tree) == ["shown(x) -> ?", "C.m(z)"]
