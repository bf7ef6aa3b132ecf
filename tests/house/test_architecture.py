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


# a name that says rebalance or balance (not imbalance)
BALANCING = re.compile(r"(^|_)(re)?balanc")


def _balancing_names_in_two_modules(sources: dict[str, str]) -> dict[str, list[str]]:
    """``{name: modules}`` of every function or method whose name says rebalance or balance and that more
    than one module defines (``sources``: module -> its text)."""
    owners = defaultdict(set)
    for module, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and BALANCING.search(node.name):
                owners[node.name].add(module)
    return {name: sorted(where) for name, where in owners.items() if len(where) > 1}


def test_each_balancing_name_is_one_concept():
    """docs/design.md §4.5: to rebalance is the orbit move, a run's periodic one its rebalancing step, to
    balance the checkpoint edit; each name is defined in one module (``Orbit.rebalance`` and its
    implementations beside it), so a name never stands for two of them."""
    sources = {str(path.relative_to(PACKAGE)): path.read_text(encoding="utf-8") for path in MODULES}
    assert not _balancing_names_in_two_modules(sources)


def test_a_balancing_name_in_two_modules_is_caught():
    orbits = "class Orbit:\n    def rebalance(self): ...\nclass Rope(Orbit):\n    def rebalance(self): ..."
    run = "class Run:\n    def rebalance(self): ...\n    def imbalance(self): ..."
    other = "def imbalance(): ...\ndef balance_layers(): ..."
    sources = {"theory/orbits.py": orbits, "training/train.py": run, "measure/drift.py": other}
    assert _balancing_names_in_two_modules(sources) == {
        "rebalance": ["theory/orbits.py", "training/train.py"]
    }


# --------------------------------------------------------------------------------------
# the house rules of size, imports and names (issue 11's, back in issue 28): each holds in CI
# --------------------------------------------------------------------------------------

MODULE_LINES = 600
TRAIN_LINES = 400  # training/train.py sets a run up and finishes it; the steps are training/loop.py's
FUNCTION_LINES = 80


def _relative(path: Path) -> str:
    return str(path.relative_to(PACKAGE))


def test_no_module_is_longer_than_the_house_rule():
    lines = {_relative(path): len(path.read_text(encoding="utf-8").splitlines()) for path in MODULES}
    long = {name: count for name, count in lines.items() if count > MODULE_LINES}
    assert not long, f"modules over {MODULE_LINES} lines: {long}"
    assert lines["training/train.py"] <= TRAIN_LINES, lines["training/train.py"]


def _long_functions(tree: ast.Module, limit: int = FUNCTION_LINES) -> dict[str, int]:
    return {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > limit
    }


def test_no_function_is_longer_than_the_house_rule():
    long = {
        _relative(path): found
        for path in MODULES
        if (found := _long_functions(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert not long, f"functions over {FUNCTION_LINES} lines: {long}"


def test_a_long_function_is_caught():
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    assert _long_functions(ast.parse(f"def long():\n{body}\n\ndef short():\n    pass\n")) == {
        "long": FUNCTION_LINES + 1
    }


def _cycles(graph) -> set[tuple[str, str]]:
    """Pairs of modules that import each other, directly or through others (grimp's import graph, imports
    inside functions and under TYPE_CHECKING included)."""
    return {
        tuple(sorted((importer, imported)))
        for importer in graph.modules
        for imported in graph.find_modules_directly_imported_by(importer)
        if graph.chain_exists(importer=imported, imported=importer)
    }


def test_no_modules_import_each_other():
    import grimp

    assert not _cycles(grimp.build_graph("attnid"))


def test_a_cycle_is_caught(tmp_path, monkeypatch):
    import grimp

    package = tmp_path / "cyclic"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from cyclic import b\n")
    (package / "b.py").write_text("def f():\n    from cyclic import c\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cyclic import a\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert len(_cycles(grimp.build_graph("cyclic", cache_dir=None))) == 3


# What a function-local import may be there for: a library that a command's --help
# (tests/cli/test_cli_help.py) or the report commands (which read runs without torch) must not load,
# or an optional dependency
LAZY_LIBRARIES = {"torch", "transformers", "safetensors", "matplotlib", "pandas", "scipy", "packaging"}
LAZY_COMMENT = "# lazy:"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(module: str, node: ast.Import | ast.ImportFrom, known: set[str]) -> list[str]:
    """The modules an import statement of ``module`` loads (``from a import b``: ``a.b`` if a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module if f"{module}.__init__" in known else module.rsplit(".", 1)[0]
        for _ in range(node.level - 1):
            package = package.rsplit(".", 1)[0]
        base = f"{package}.{base}" if base else package
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]


def _import_graph() -> tuple[
    dict[str, set[str]], dict[str, list[tuple[int, list[str]]]], dict[str, list[str]]
]:
    """``(top-level imports, function-local imports with their line, source lines)`` per module. Imports
    under ``if TYPE_CHECKING:`` are not run, so they are neither."""
    known = {_module_name(path) for path in MODULES} | {
        _module_name(path) + ".__init__" for path in MODULES if path.name == "__init__.py"
    }
    top: dict[str, set[str]] = {}
    local: dict[str, list[tuple[int, list[str]]]] = {}
    sources: dict[str, list[str]] = {}
    for path in MODULES:
        module, text = _module_name(path), path.read_text(encoding="utf-8")
        tree, sources[module] = ast.parse(text), text.splitlines()
        found: set[str] = set()
        statements = list(tree.body)
        while statements:
            node = statements.pop()
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.update(_imported(module, node, known))
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                statements += node.body + node.orelse
            elif isinstance(node, ast.Try):
                statements += node.body
        top[module] = found | {name.rsplit(".", 1)[0] for name in found if name.startswith("attnid.")}
        local[module] = [
            (node.lineno, _imported(module, node, known))
            for function in ast.walk(tree)
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
            for node in ast.walk(function)
            if isinstance(node, (ast.Import, ast.ImportFrom))
        ]
    return top, local, sources


def _loads(modules: list[str], top: dict[str, set[str]]) -> set[str]:
    """Every module that importing ``modules`` loads (their top-level imports, transitively)."""
    seen, stack = set(), list(modules)
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            parts = name.split(".")
            stack += [".".join(parts[:i]) for i in range(1, len(parts))] + sorted(top.get(name, ()))
    return seen


def _lazy_import_problems(top, local, sources) -> list[str]:
    problems = []
    for module, imports in local.items():
        block = {line for line, _ in imports}
        for line, targets in imports:
            heavy = {name.split(".")[0] for name in _loads(targets, top)} & LAZY_LIBRARIES
            if not heavy:
                problems.append(f"{module}:{line} imports {targets} inside a function: import it at the top")
            above = line - 1  # over the other imports of its block and blank lines, to its comment
            while above >= 1 and (above in block or not sources[module][above - 1].strip()):
                above -= 1
            if not sources[module][above - 1].strip().startswith(LAZY_COMMENT):
                problems.append(
                    f"{module}:{line}: a function-local import needs a '{LAZY_COMMENT} <why>' line"
                )
    return problems


def test_imports_inside_functions_keep_a_heavy_library_out_and_say_so():
    """Imports sit at the top of a module. One inside a function keeps a heavy or optional library
    (LAZY_LIBRARIES) out of a command that runs without it, under a '# lazy: <why>' comment."""
    problems = _lazy_import_problems(*_import_graph())
    assert not problems, "\n".join(problems)


def test_a_lazy_import_without_reason_or_weight_is_caught():
    top = {"attnid.heavy": {"torch"}, "attnid.light": {"json"}, "attnid.user": set()}
    source = [
        "def f():",
        "    # lazy: torch, which --help must not import",
        "    from attnid import heavy",
        "",
        "    import attnid.light",
        "def g():",
        "    from attnid import heavy",
    ]
    local = {"attnid.user": [(3, ["attnid.heavy"]), (5, ["attnid.light"]), (7, ["attnid.heavy"])]}
    problems = _lazy_import_problems(top, local, {"attnid.user": source})
    assert problems == [
        "attnid.user:5 imports ['attnid.light'] inside a function: import it at the top",
        "attnid.user:7: a function-local import needs a '# lazy: <why>' line",
    ]


# Names that say nothing of what a module holds
GRAB_BAG_NAMES = {"utils", "util", "helpers", "misc", "tools", "core", "base", "lib", "stuff", "other"}


def test_modules_are_named_for_what_they_hold():
    """No grab-bag module, and training/loop.py holds the training loop (the step loop and what it calls per
    step; setting up and finishing a run is training/train.py's)."""
    assert not [_relative(path) for path in MODULES if path.stem in GRAB_BAG_NAMES]
    loop = ast.parse((PACKAGE / "training" / "loop.py").read_text(encoding="utf-8"))
    step_loops = [
        node
        for node in ast.walk(loop)
        if isinstance(node, (ast.While, ast.For)) and "train_step" in ast.unparse(node)
    ]
    assert step_loops, "training/loop.py has no loop over the training steps"
    train = ast.parse((PACKAGE / "training" / "train.py").read_text(encoding="utf-8"))
    assert not [
        node
        for node in ast.walk(train)
        if isinstance(node, (ast.While, ast.For)) and "step" in ast.unparse(node)
    ]


# The folders of tests/: one per layer of the package (and the workflow), the house's own rules, and the
# helpers that every folder imports (pyproject.toml's pytest `pythonpath`)
TEST_FOLDERS = {"theory", "model", "training", "edits", "reports", "workflow", "cli", "house"}
HELPERS_FOLDER = "helpers"


def test_tests_sit_in_a_folder_per_layer_and_share_helpers_from_one_place(repo_root):
    """Every test module is tests/<layer>/test_*.py; every other module of tests/ (but conftest.py) is a
    helper in tests/helpers/; and no test module imports another, so a shared check has one home."""
    tests = repo_root / "tests"
    misplaced, test_stems = [], set()
    for path in sorted(tests.rglob("*.py")):
        where = path.relative_to(tests)
        if where == Path("conftest.py"):
            continue
        folder = where.parts[0] if len(where.parts) == 2 else None
        if path.name.startswith("test_"):
            test_stems.add(path.stem)
            if folder not in TEST_FOLDERS:
                misplaced.append(
                    f"{where}: a test module belongs in tests/<{'|'.join(sorted(TEST_FOLDERS))}>/"
                )
        elif folder != HELPERS_FOLDER:
            misplaced.append(f"{where}: a helper belongs in tests/{HELPERS_FOLDER}/")
    assert not misplaced, "\n".join(misplaced)
    borrowing = []
    for path in sorted(tests.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            borrowing += [f"{path.relative_to(tests)} imports {name}" for name in names if name in test_stems]
    assert not borrowing, "move what they share into tests/helpers/:\n" + "\n".join(borrowing)
