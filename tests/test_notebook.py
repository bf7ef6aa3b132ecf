"""notebooks/explore.ipynb runs top to bottom (nbclient) against the smoke build's outputs."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from pipeline_helpers import REPO, shared_smoke_run


@pytest.mark.slow
def test_explore_notebook_runs_on_the_smoke_outputs(tmp_path_factory, shakespeare_url, monkeypatch):
    workdir = shared_smoke_run(tmp_path_factory, shakespeare_url)
    monkeypatch.setenv("ATTNID_WORKDIR", str(workdir))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(REPO / "notebooks" / "explore.ipynb", as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path_factory.mktemp("nb"))}}).execute()
    outputs = ["".join(o.get("text", "") for o in cell.get("outputs", [])) for cell in notebook.cells
               if cell.cell_type == "code"]
    drawn = next(text for text in outputs if "cases drawn from" in text)
    assert drawn.startswith("3 cases drawn from 10 runs"), drawn  # smoke: 5 cases x 2 seeds, 3 chosen
    claims_cell = notebook.cells[3]
    assert "rho_qk sgd max" in str(claims_cell.outputs)
