"""A finished build of the pipeline: its folder ``results/<config>/`` in a checkout, found by name or as the
latest one, and its tables read as data frames (for the notebook and for Python users; docs/api.md).

    build = locate_build()                # the latest build of the checkout holding the working directory
    build = locate_build("smoke")         # results/smoke (or any path to a results/<config>/ folder)
    tables = read_tables(build)           # {"claims": DataFrame, "cases": ..., "runs": ..., ...}
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from attnid.common.errors import UserError

RESULTS = "results"  # where every config's results_dir lies in the shipped configs
# A build is finished once `attnid tables` wrote this (the other tables and the figures depend on it).
MARKER = Path("tables") / "runs.csv"


def checkout_of(start: str | Path | None = None) -> Path:
    """The checkout (the folder holding ``Snakefile``) that holds ``start`` (default: the working
    directory), e.g. the repository root from its ``notebooks/`` folder."""
    here = Path(start if start is not None else Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "Snakefile").is_file():
            return folder
    raise UserError(f"{here} is not inside a checkout of attnid (no Snakefile here or above): name the build")


def finished_builds(checkout: str | Path) -> list[Path]:
    """Every finished build under ``checkout/results/``, the latest (newest tables) first."""
    builds = [marker.parent.parent for marker in Path(checkout, RESULTS).glob(f"*/{MARKER}")]
    return sorted(builds, key=lambda build: (build / MARKER).stat().st_mtime_ns, reverse=True)


def locate_build(chosen: str | Path | None = None, start: str | Path | None = None) -> Path:
    """The folder ``results/<config>/`` of a finished build.

    ``chosen``: None for the latest build of the checkout holding ``start`` (default: the working
    directory); a path (absolute, or relative to that checkout); or a config's folder name under
    ``results/`` (``"smoke"``, ``"default"``).
    """
    if chosen is None:
        checkout = checkout_of(start)
        builds = finished_builds(checkout)
        if not builds:
            raise UserError(
                f"no finished build under {checkout / RESULTS}: run snakemake first "
                f"(a one-minute one: snakemake --cores 2 --configfile config/smoke.yaml)"
            )
        return builds[0]
    path = Path(chosen).expanduser()
    if not path.is_absolute():
        checkout = checkout_of(start)
        candidates = [checkout / path, checkout / RESULTS / path]
        path = next((c for c in candidates if (c / MARKER).is_file()), candidates[0])
    if not (path / MARKER).is_file():
        raise UserError(f"{path} is not a finished build (no {MARKER}): run snakemake for its config first")
    return path.resolve()


def read_tables(build: str | Path) -> dict[str, pd.DataFrame]:
    """Every CSV table of a build (``tables/*.csv``) by name: ``claims``, ``runs``, ``cases``, ``sweep``,
    ``sweep_slopes`` and, where the config has those stages, the studies', ``prune``, ``interventions``."""
    folder = Path(build) / "tables"
    if not (Path(build) / MARKER).is_file():
        raise UserError(f"{build} is not a finished build (no {MARKER})")
    return {path.stem: pd.read_csv(path) for path in sorted(folder.glob("*.csv"))}
