"""notebooks/explore.ipynb runs top to bottom (nbclient) against the smoke build's outputs, with no
environment variable: on the latest build of the checkout it runs in, or on the one its first cell names;
with ipywidgets (controls that redraw the plot) and without it (a hint, no error). How it finds a build
(attnid.reports.builds) on folders of fake builds."""

from __future__ import annotations

import os
import time

import nbformat
import pytest
from nbclient import NotebookClient
from pipeline_helpers import REPO, shared_smoke_run, smoke_config

from attnid.common.errors import UserError
from attnid.reports.builds import locate_build, read_tables

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _block_ipywidgets(folder) -> str:
    """A PYTHONPATH entry whose ``ipywidgets`` fails to import, as if it were not installed."""
    stub = folder / "ipywidgets"
    stub.mkdir()
    (stub / "__init__.py").write_text("raise ImportError('ipywidgets is blocked for this test')\n")
    return str(folder)


def _widget_outputs(notebook) -> list[dict]:
    """What the kernel drew into the notebook's Output widgets (nbclient stores their state)."""
    state = notebook.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    return [
        output
        for model in state.values()
        if model["model_name"] == "OutputModel"
        for output in model["state"].get("outputs", [])
    ]


@pytest.mark.slow
@pytest.mark.parametrize("ipywidgets, build", [("installed", "latest"), ("missing", "named")])
def test_explore_notebook_runs_on_the_smoke_outputs(
    ipywidgets, build, tmp_path_factory, shakespeare_url, monkeypatch
):
    workdir = shared_smoke_run(tmp_path_factory, shakespeare_url)
    for name in ("ATTNID_WORKDIR", "ATTNID_RESULTS_DIR", "MPLBACKEND"):  # none needed; MPLBACKEND: inline
        monkeypatch.delenv(name, raising=False)
    if ipywidgets == "missing":
        blocker = _block_ipywidgets(tmp_path_factory.mktemp("no_ipywidgets"))
        monkeypatch.setenv(
            "PYTHONPATH", os.pathsep.join(filter(None, [blocker, os.environ.get("PYTHONPATH")]))
        )
    notebook = nbformat.read(REPO / "notebooks" / "explore.ipynb", as_version=4)
    first = notebook.cells[1]
    assert "\nBUILD = None  #" in first.source
    smoke = smoke_config()["results_dir"]
    if build == "named":  # the folder name under results/, as the notebook's first cell says
        first.source = first.source.replace("BUILD = None", f"BUILD = {smoke.removeprefix('results/')!r}", 1)
    # the kernel starts where Jupyter starts it, in the notebook's folder inside the checkout
    folder = workdir / f"notebooks-{ipywidgets}"
    folder.mkdir(exist_ok=True)
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    ).execute()
    shown = "".join(str(output.get("data", {}).get("text/plain", "")) for output in first.outputs)
    assert str((workdir / smoke).resolve()) in shown, shown
    outputs = [
        "".join(o.get("text", "") for o in cell.get("outputs", []))
        for cell in notebook.cells
        if cell.cell_type == "code"
    ]
    drawn = next(text for text in outputs if "cases drawn from" in text)
    smoke_runs = len(smoke_config()["cases"]) * len(smoke_config()["seeds"])
    assert drawn.startswith(f"3 cases drawn from {smoke_runs} runs"), drawn  # every case run, 3 chosen
    claims_cell = notebook.cells[3]
    assert "E1 sgd rho max" in str(claims_cell.outputs)

    last_cell = notebook.cells[-1].outputs
    shown = [output for output in last_cell if WIDGET_VIEW in output.get("data", {})]
    drawn_by_widgets = _widget_outputs(notebook)
    if ipywidgets == "installed":
        assert len(shown) == 1, last_cell  # the controls
        assert not [o for o in drawn_by_widgets if o["output_type"] == "error"], drawn_by_widgets
        assert any("image/png" in o.get("data", {}) for o in drawn_by_widgets), drawn_by_widgets
    else:
        assert not shown and not drawn_by_widgets
        assert "pip install ipywidgets" in "".join(o.get("text", "") for o in last_cell), last_cell


def _fake_build(checkout, name: str, age_s: float):
    tables = checkout / "results" / name / "tables"
    tables.mkdir(parents=True)
    (tables / "runs.csv").write_text("case,seed\nsgd,0\n")
    (tables / "claims.csv").write_text(f"claim,result\n{name},pass\n")
    stamp = time.time() - age_s
    os.utime(tables / "runs.csv", (stamp, stamp))
    return tables.parent


def test_the_latest_build_or_the_named_one(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "notebooks").mkdir(parents=True)
    (checkout / "Snakefile").write_text("")
    old = _fake_build(checkout, "default", age_s=3600)
    new = _fake_build(checkout, "smoke", age_s=10)
    (checkout / "results" / "unfinished" / "runs").mkdir(parents=True)  # no tables yet: not a build
    assert locate_build(start=checkout / "notebooks") == new.resolve()
    assert locate_build("default", start=checkout / "notebooks") == old.resolve()
    assert locate_build("results/default", start=checkout) == old.resolve()
    assert locate_build(old) == old.resolve()
    assert read_tables(new)["claims"]["claim"].tolist() == ["smoke"]
    assert sorted(read_tables(old)) == ["claims", "runs"]
    with pytest.raises(UserError, match="unfinished is not a finished build"):
        locate_build("unfinished", start=checkout)
    with pytest.raises(UserError, match="not inside a checkout"):
        locate_build(start=tmp_path)
    (checkout / "results").rename(checkout / "elsewhere")
    with pytest.raises(UserError, match="no finished build under .*: run snakemake first"):
        locate_build(start=checkout)
