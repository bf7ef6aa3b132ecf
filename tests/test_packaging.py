"""The project installs as documented and its metadata agrees with itself."""

from __future__ import annotations

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


def test_environment_yml_matches_pyproject(repo_root):
    project = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    requirements = project["dependencies"] + [r for extra in ENVIRONMENT_EXTRAS for r in extras[extra]]
    wanted = {CONDA_NAMES.get(_name(r), _name(r)): r for r in requirements}
    env = yaml.safe_load((repo_root / "environment.yml").read_text())
    conda = {_name(d): d for d in env["dependencies"] if isinstance(d, str)}
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
    pip_section = [d for d in env["dependencies"] if isinstance(d, dict)][0]["pip"]
    assert "-e ." in pip_section


def test_torch_range_admits_cpu_build(repo_root):
    project = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]
    torch_req = next(r for r in project["dependencies"] if _name(r) == "torch")
    from packaging.specifiers import SpecifierSet

    assert "2.13.0" in SpecifierSet(torch_req[len("torch") :])


def test_ci_runs_the_readme_test_command(repo_root):
    readme = (repo_root / "README.md").read_text()
    first_block = re.search(r"```(?:bash|sh)?\n(.*?)```", readme, re.S).group(1).strip().splitlines()
    assert len(first_block) == 2, "README's first block is the two commands: set up + run; test"
    assert "snakemake" in first_block[0]
    test_command = first_block[1].split("#")[0].strip()
    ci = (repo_root / ".ci" / "run").read_text()
    assert any(line.strip() == test_command for line in ci.splitlines()), f"{test_command!r} not in .ci/run"


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
