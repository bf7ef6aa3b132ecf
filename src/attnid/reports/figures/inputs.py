"""What a figure reads and what its drawing returns.

A figure module declares ``INPUTS``: for each source it reads, the files it reads there, e.g.
``{"theory": ("counts.csv", "nullity.csv")}``; for a source of run directories (``runs``,
``intervention_runs``, ``identity_runs``) the files of each run, :data:`RUN_FILES`. The workflow turns
``INPUTS`` into the exact input files of the figure's job and into the flags of ``attnid figures``
(:data:`SOURCE_FLAGS`); the command hands the figure a :class:`Sources`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from attnid.common.errors import UserError

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

RUN_FILES = ("run.json", "metrics.csv")  # what a figure reads of each run directory (attnid train's)
# source -> the `attnid figures` flag that names it
SOURCE_FLAGS = {
    "theory": "--theory-dir",
    "tables": "--tables",
    "runs": "--runs",
    "intervention_runs": "--intervention-runs",
    "identity_runs": "--identity-runs",
}
FOLDERS = ("theory", "tables")  # the sources that are a folder (the others list run directories)
# source -> the commands that write it (for the error a missing file gives)
SOURCE_WRITERS = {
    "theory": "'attnid counts' / 'attnid verify'",
    "tables": "'attnid tables' (and 'attnid studies', 'attnid interventions-table')",
}
RunGroup = list[tuple[dict, "pd.DataFrame"]]  # (run.json, metrics.csv) of each run


class Drawing(NamedTuple):
    """A drawn figure and the numbers its caption is filled with."""

    figure: Figure
    numbers: dict[str, Any]


@dataclass(frozen=True)
class Sources:
    """The folders and run directories ``attnid figures`` was given (None: not given)."""

    theory: Path | None = None
    tables: Path | None = None
    runs_dir: Path | None = None  # every run below it, unless ``runs`` lists them
    runs: list[str] | None = None
    intervention_runs: list[str] | None = None
    identity_runs: list[str] | None = None
    loaded: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def given(self, source: str) -> bool:
        """Whether the source was given at all (a folder, or at least one run directory)."""
        if source == "runs":
            return self.runs_dir is not None or bool(self.runs)
        return bool(getattr(self, source))

    def has(self, source: str, name: str) -> bool:
        """Whether the folder ``source`` was given and holds the file ``name``."""
        folder = getattr(self, source)
        return folder is not None and (Path(folder) / name).is_file()

    def file(self, source: str, name: str) -> Path:
        """The file ``name`` of the folder ``source``; a missing one is a one-line error."""
        folder = getattr(self, source)
        if folder is None:
            raise UserError(f"it reads {name}: give {SOURCE_FLAGS[source]} DIR")
        path = Path(folder) / name
        if not path.is_file():
            raise UserError(
                f"{path} not found; run {SOURCE_WRITERS[source]} first (or simply snakemake --cores all)"
            )
        return path

    def case_runs(self) -> dict[str, RunGroup]:
        """{case: runs} of ``runs`` (or of everything under ``runs_dir``), loaded once."""
        # lazy: pandas (training.rundir), which reading the figure registry (the workflow, --help) skips
        from attnid.training.rundir import load_runs_by_case

        if not self.given("runs"):
            raise UserError("it reads the case runs: give --runs-dir DIR or --runs RUN_DIR ...")
        if "runs" not in self.loaded:
            runs = load_runs_by_case(self.runs_dir, self.runs)
            if not runs:
                raise UserError(f"no runs (run.json) under {self.runs_dir}; run the training jobs first")
            self.loaded["runs"] = runs
        return self.loaded["runs"]
