"""notebooks/explore.ipynb runs top to bottom (nbclient) against the smoke build's outputs,
with ipywidgets (controls that redraw the plot) and without it (a hint, no error)."""

from __future__ import annotations

import os

import nbformat
import pytest
from nbclient import NotebookClient
from pipeline_helpers import REPO, shared_smoke_run, smoke_config

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
@pytest.mark.parametrize("ipywidgets", ["installed", "missing"])
def test_explore_notebook_runs_on_the_smoke_outputs(
    ipywidgets, tmp_path_factory, shakespeare_url, monkeypatch
):
    workdir = shared_smoke_run(tmp_path_factory, shakespeare_url)
    monkeypatch.setenv("ATTNID_WORKDIR", str(workdir))
    monkeypatch.setenv("ATTNID_RESULTS_DIR", smoke_config()["results_dir"])
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend, as in Jupyter
    if ipywidgets == "missing":
        blocker = _block_ipywidgets(tmp_path_factory.mktemp("no_ipywidgets"))
        monkeypatch.setenv(
            "PYTHONPATH", os.pathsep.join(filter(None, [blocker, os.environ.get("PYTHONPATH")]))
        )
    notebook = nbformat.read(REPO / "notebooks" / "explore.ipynb", as_version=4)
    NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path_factory.mktemp("nb"))}},
    ).execute()
    outputs = [
        "".join(o.get("text", "") for o in cell.get("outputs", []))
        for cell in notebook.cells
        if cell.cell_type == "code"
    ]
    drawn = next(text for text in outputs if "cases drawn from" in text)
    assert drawn.startswith("3 cases drawn from 10 runs"), drawn  # smoke: 5 cases x 2 seeds, 3 chosen
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
