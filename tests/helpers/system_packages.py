"""Tests that drive programs from Debian packages (TeX, poppler, Chromium, SLURM) skip where a program is
missing, naming it and the one apt line that installs them all (the README's). .ci/run installs them and sets
``ATTNID_REQUIRE_SYSTEM_PACKAGES=1``: there a missing program fails the test instead.

    @needs("latexmk", "siunitx.sty", "pdffonts")
    def test_pdf_...(): ...

A name ending in ``.sty`` is a LaTeX package, looked up with ``kpsewhich``.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

# program (or LaTeX package) -> the Debian package that installs it
PACKAGE_OF = {
    "latexmk": "latexmk",
    "siunitx.sty": "texlive-science",  # the appendix's numbers (paper/main.tex)
    "kpsewhich": "texlive-latex-recommended",  # (its dependency texlive-binaries)
    "pdflatex": "texlive-latex-recommended",
    "pdffonts": "poppler-utils",
    "pdftotext": "poppler-utils",
    "pdftoppm": "poppler-utils",
    "chromium": "chromium",
    "munged": "munge",
    "mariadbd": "mariadb-server",
    "mariadb-install-db": "mariadb-server",
    "mariadb": "mariadb-server",
    "slurmdbd": "slurmdbd",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
    "srun": "slurm-client",
    "sacct": "slurm-client",
    "squeue": "slurm-client",
    "sinfo": "slurm-client",
    "sacctmgr": "slurm-client",
    "scontrol": "slurm-client",
}
# Every package the tests use (the fonts TeX needs beyond latexmk's dependencies included), as README.md's
# apt line and .ci/run name them (tests/house/test_packaging.py checks both).
APT_PACKAGES = (
    "latexmk",
    "texlive-latex-recommended",
    "texlive-fonts-recommended",
    "texlive-science",  # siunitx: the appendix's numbers
    "lmodern",
    "poppler-utils",
    "chromium",  # the Snakemake report, opened headless (tests/reports/test_report.py)
    "slurmctld",
    "slurmd",
    "slurm-client",
    "slurmdbd",
    "munge",
    "mariadb-server",
)
APT_LINE = "sudo apt-get install " + " ".join(APT_PACKAGES)
REQUIRED = os.environ.get("ATTNID_REQUIRE_SYSTEM_PACKAGES") == "1"


def _installed(name: str) -> bool:
    if name.endswith(".sty"):
        kpsewhich = shutil.which("kpsewhich")
        found = kpsewhich and subprocess.run([kpsewhich, name], capture_output=True, text=True).stdout
        return bool(found and found.strip())
    return shutil.which(name) is not None


def missing_programs(*programs: str) -> list[str]:
    return [name for name in programs if not _installed(name)]


def missing_reason(missing: list[str]) -> str:
    packages = sorted({PACKAGE_OF[name] for name in missing})
    return f"needs {', '.join(missing)} (Debian: {' '.join(packages)}); the README's line: {APT_LINE}"


def needs(*programs: str) -> pytest.MarkDecorator:
    """Skip the test where one of ``programs`` is not on PATH (under .ci/run, which installs them: run it)."""
    missing = missing_programs(*programs)
    return pytest.mark.skipif(bool(missing) and not REQUIRED, reason=missing_reason(missing))


def require_or_skip(missing: list[str], what: str) -> None:
    """In a test: skip where something is ``missing`` (``what`` says for what, the message names each and
    the apt line); under .ci/run, which installs them, fail."""
    if missing:
        message = f"{what} needs {', '.join(missing)}; the README's line: {APT_LINE}"
        if REQUIRED:
            pytest.fail(message)
        pytest.skip(message)
