"""The project installs as documented and its metadata agrees with itself."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib

import yaml

from attnid.cli import COMMANDS, main

CONDA_NAMES = {"torch": "pytorch"}
ENVIRONMENT_EXTRAS = ("test", "hf", "notebook")  # environment.yml installs these; slurm is a pip extra


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].strip().lower()


def extra_requirements(extras: dict[str, list[str]], name: str) -> list[str]:
    """An extra's requirements, with the extras of this package it names (``attnid[hf]``) spelled out."""
    requirements = []
    for requirement in extras[name]:
        if _name(requirement) == "attnid":
            inner = requirement[requirement.index("[") + 1 : requirement.index("]")]
            requirements += [
                r for extra in inner.split(",") for r in extra_requirements(extras, extra.strip())
            ]
        else:
            requirements.append(requirement)
    return requirements


def test_environment_yml_matches_pyproject(repo_root):
    project = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    requirements = project["dependencies"] + [
        r for extra in ENVIRONMENT_EXTRAS for r in extra_requirements(extras, extra)
    ]
    wanted = {CONDA_NAMES.get(_name(r), _name(r)): r for r in requirements}
    env = yaml.safe_load((repo_root / "environment.yml").read_text())
    pip_section = [d for d in env["dependencies"] if isinstance(d, dict)][0]["pip"]
    # conda's packages, and those only pip installs there (the SLURM executor plugin)
    conda = {_name(d): d for d in env["dependencies"] + pip_section if isinstance(d, str) and d != "-e ."}
    missing = sorted(set(wanted) - set(conda))
    assert not missing, f"environment.yml lacks {missing}"
    for name, requirement in wanted.items():
        bound = (
            requirement[len(_name(requirement)) :].strip()
            if name != "pytorch"
            else requirement[len("torch") :]
        )
        assert conda[name].endswith(bound), (
            f"{name}: pyproject says {requirement!r}, environment.yml {conda[name]!r}"
        )
    assert "-e ." in pip_section


def test_the_test_extra_holds_what_the_tests_import(repo_root):
    """Every third-party module a test file imports is installed by the README's set-up line: the package's
    dependencies and its test extra."""
    project = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]
    installed = {
        _name(r)
        for r in project["dependencies"] + extra_requirements(project["optional-dependencies"], "test")
    }
    module_names = {
        "yaml": "pyyaml",
        "nbformat": "nbformat",
        "packaging": "packaging",
    }  # import name -> PyPI's
    local = {path.stem for path in (repo_root / "tests").rglob("*.py")} | {"attnid", "conftest"}
    imported = set()
    for path in (repo_root / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = {m for m in imported - local if m not in sys.stdlib_module_names and m != "__future__"}
    needed = {module_names.get(m, m).replace("_", "-") for m in third_party}
    assert needed <= installed, f"tests import {sorted(needed - installed)}, which .[test] does not install"


def test_torch_range_admits_cpu_build(repo_root):
    project = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]
    torch_req = next(r for r in project["dependencies"] if _name(r) == "torch")
    from packaging.specifiers import SpecifierSet

    assert "2.13.0" in SpecifierSet(torch_req[len("torch") :])


def readme_commands(repo_root) -> dict[str, str]:
    """The README's first block, {label: command}: each line is ``COMMAND  # LABEL (...)``."""
    readme = (repo_root / "README.md").read_text()
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", readme, re.S).group(1).strip().splitlines()
    commands = {}
    for line in block:
        command, _, comment = line.partition("  # ")
        commands[comment.split("(")[0].strip()] = command.strip()
    return commands


# The build that ends the README's set-up line: CI runs the line without it (an hour on 2 cores).
README_RUN = " && snakemake --cores all"


def test_ci_runs_the_readme_set_up_and_test_lines(repo_root):
    commands = readme_commands(repo_root)
    assert list(commands) == ["set up + run", "test"], "README's first block: set up + run, then test"
    assert commands["set up + run"].endswith(README_RUN)
    set_up = commands["set up + run"][: -len(README_RUN)]
    assert 'pip install -e ".[test]"' in set_up and "pytest" in commands["test"]
    ci = [line.strip() for line in (repo_root / ".ci" / "run").read_text().splitlines()]
    for label, command in (("set-up", set_up), ("test", commands["test"])):
        assert command in ci, f"the README's {label} command is not in .ci/run: {command!r}"
    assert ci.index(set_up) < ci.index(commands["test"])


def test_readme_and_ci_name_the_same_debian_packages(repo_root):
    from system_packages import APT_LINE, APT_PACKAGES

    readme = " ".join((repo_root / "README.md").read_text().split())  # its lines rejoined
    assert f"`{APT_LINE}`" in readme
    ci = (repo_root / ".ci" / "run").read_text()
    installed = re.search(r"apt-get install -y -qq --no-install-recommends \\\n(.*?)>/dev/null", ci, re.S)
    assert sorted(installed.group(1).replace("\\", " ").split()) == sorted(APT_PACKAGES)


def test_ci_and_the_hooks_run_the_gates_of_the_development_guide(repo_root):
    """docs/development.md's "Before you commit" block is what .ci/run runs, in that order, and what
    .pre-commit-config.yaml's hooks run."""
    guide = (repo_root / "docs" / "development.md").read_text()
    block = re.search(r"## Before you commit\n.*?```bash\n(.*?)```", guide, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert {"ruff check .", "ruff format --check .", "mypy src", "lint-imports"} <= set(commands)
    ci = [line.strip() for line in (repo_root / ".ci" / "run").read_text().splitlines()]
    missing = [command for command in commands if command not in ci]
    assert not missing, f".ci/run does not run {missing}"
    positions = [ci.index(command) for command in commands]
    assert positions == sorted(positions), ".ci/run runs the gates in another order than the guide"
    hooks = yaml.safe_load((repo_root / ".pre-commit-config.yaml").read_text())["repos"][0]["hooks"]
    assert sorted(hook["entry"] for hook in hooks) == sorted(commands)


def test_cli_lists_every_command(capsys):
    try:
        main(["--help"])
    except SystemExit as exit_:
        assert exit_.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_unknown_command_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "attnid", "trian"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "invalid choice" in proc.stderr


def test_repository_needs_no_sibling_folder(repo_root):
    """Code, tests, notebooks, benchmarks and CI find everything inside the clone (the data ships in
    assets/)."""
    # a path into a sibling folder ("<that>/..." or "<that>" / ...), spelled in parts so this file does
    # not match itself
    sibling = re.compile(r"\b" + "sha" + r"red\b\W{0,4}/")
    offenders = []
    for folder in ("src", "tests", "notebooks", ".ci", "workflow", "config", "benchmarks"):
        for path in sorted((repo_root / folder).rglob("*")):
            built = any(part == "__pycache__" or part.endswith(".egg-info") for part in path.parts)
            if path.is_file() and not built:
                text = path.read_text(encoding="utf-8", errors="replace")
                offenders += [
                    f"{path.relative_to(repo_root)}:{n}"
                    for n, line in enumerate(text.splitlines(), 1)
                    if sibling.search(line)
                ]
    assert not offenders, f"paths into a folder beside the clone: {offenders}"
