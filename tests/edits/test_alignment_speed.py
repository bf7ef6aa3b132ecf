"""benchmarks/alignment_speed.py runs: its nanoGPT part at a toy shape prints the table's rows against the
targets and the pair's distances, and writes what ``attnid align`` writes (the timing itself is a
benchmark, never a test)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from pipeline_helpers import REPO

SCRIPT = REPO / "benchmarks" / "alignment_speed.py"


def test_the_nanogpt_part_runs_at_a_toy_shape_and_prints_its_lines(tmp_path):
    shape = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *shape, "--no-smollm2", "--work", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("load average before") and lines[1].split() == [
        "measure",
        "measured",
        "target",
        "ratio",
    ]
    wall = next(line for line in lines if line.startswith("attnid align, nanoGPT: wall s"))
    measured, target, ratio = map(float, wall.split()[-3:])
    assert target == 10.0 and measured > 0 and abs(ratio - measured / target) < 0.01
    assert any(line.startswith("  align_whole alone, in process: s") for line in lines)
    assert any(line.startswith("attnid align, nanoGPT: peak GiB") for line in lines)
    assert not any("SmolLM2" in line for line in lines)  # --no-smollm2
    note = next(line for line in lines if line.startswith("nanoGPT pair, two random seeds, L=1 H=2 E=16"))
    before, after = map(float, re.search(r"distance (\S+) -> (\S+) ", note).groups())
    report = json.loads((tmp_path / "align.json").read_text())
    assert after <= before and (tmp_path / "b_aligned.pt").is_file()
    assert f"{report['distance_after']['total']:.4g}" == f"{after:.4g}"
