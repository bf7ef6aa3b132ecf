"""One ``python -m attnid`` process timed as a user runs it (imports included), under ``/usr/bin/time -v``:
shared by the benchmarks that hold a command to a wall-time and memory target."""

from __future__ import annotations

import re
import subprocess
import sys
import time


def timed(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and peak resident GiB of one ``python -m attnid`` process."""
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "attnid", *argv]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"attnid {' '.join(argv[:2])} failed: {done.stderr.strip().splitlines()[-1]}")
    peak_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
    return seconds, peak_kib / 2**20
