"""``attnid --help`` and every command's ``--help`` answer at once: they import neither torch nor the other
heavy libraries, which each command imports only to run. Checked in one fresh interpreter that asks for
every help text in turn (a library imported by one command's help stays loaded: the first is blamed)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from attnid.cli import COMMANDS

# Seconds to import on a laptop, each more than the 1 s that --help may take.
HEAVY = ("torch", "transformers", "safetensors", "matplotlib")

PROBE = """
import contextlib, io, json, sys
from attnid.cli import main
answers = {}
for command in [""] + sys.argv[1:]:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main(([command] if command else []) + ["--help"])
        except SystemExit as exit_:
            status = exit_.code
    answers[command] = {"status": status, "help": out.getvalue(), "modules": sorted(sys.modules)}
print(json.dumps(answers))
"""


@pytest.fixture(scope="module")
def helps() -> dict[str, dict]:
    """Every command's --help (and the top-level one, under ""): exit status, text, modules loaded by then."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *COMMANDS], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_imports_no_heavy_library(helps, command):
    answer = helps[command]
    assert answer["status"] == 0 and answer["help"].startswith(f"usage: attnid {command}".rstrip())
    loaded = [name for name in HEAVY if name in answer["modules"]]
    assert not loaded, f"'attnid {command} --help' imports {loaded}"


def test_figures_help_names_every_figure(helps):
    from attnid.reports.figures import registry

    text = helps[""]["help"] + helps["figures"]["help"]
    assert re.findall(r"figures 1-(\d+)", text) == [str(len(registry()))] * 2


def test_every_file_a_help_text_points_to_exists(helps):
    from doc_pointers import REPO, pointers_of, unresolved

    problems = [
        f"attnid {command} --help: {problem}"
        for command, answer in helps.items()
        for target in pointers_of(answer["help"], links=False)
        if (problem := unresolved(target, REPO))
    ]
    assert not problems, problems
    assert any(pointers_of(answer["help"], links=False) for answer in helps.values())  # some are checked
