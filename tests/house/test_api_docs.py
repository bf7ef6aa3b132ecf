"""docs/api.md's code blocks run as written, in order, and do what their prose says: the edits of a model
in memory keep its function and reach their closed forms; the build's tables are read (on the smoke build)."""

from __future__ import annotations

import contextlib
import io
import re

import pytest
import torch
from pipeline_helpers import REPO, shared_smoke_run

from attnid.theory import counts

TABLES_SECTION = "## Read a build's tables"


def code_blocks(section: str | None = None, exclude: str | None = None) -> list[str]:
    """docs/api.md's ```python blocks, those of one ``## `` section or all but one."""
    text = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    blocks = []
    for part in re.split(r"(?m)^(?=## )", text):
        heading = part.splitlines()[0] if part.startswith("## ") else None
        if (section is None or heading == section) and (exclude is None or heading != exclude):
            blocks += re.findall(r"```python\n(.*?)```", part, re.S)
    return blocks


def run_blocks(blocks: list[str]) -> tuple[dict, str]:
    namespace: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        for block in blocks:
            exec(compile(block, "docs/api.md", "exec"), namespace)  # the page's own examples
    return namespace, printed.getvalue()


def test_the_model_examples_run_and_keep_the_function():
    blocks = code_blocks(exclude=TABLES_SECTION)
    assert len(blocks) >= 4
    ns, printed = run_blocks(blocks)
    # inspect: GPT-2 at E = 32, H = 4 with biases; the closed forms of counts.py
    shape = counts.layer_shape(32, 4, bias=True, out_bias=True)
    per_layer = counts.layer_counts(shape)
    assert ns["total"]["unidentified"] == 2 * per_layer["unidentified_per_layer"]
    assert f"{ns['total']['unidentified']} of {ns['total']['attention_params']} attention" in printed
    assert "columns:" in printed and "total" in printed
    assert all(layer["orbit_matches_closed_form"] for layer in ns["report"]["layers"])
    # prune: the key and value biases, as counted
    assert ns["pruned"]["redundant_params"] == 2 * (
        counts.unidentified_key_bias_params(shape) + counts.unidentified_value_bias_params(shape)
    )
    # balance: mu to 0, the norm down, the logits kept to float32 round-off
    assert ns["balanced"]["mu_qk_before"] > 0.1 and ns["balanced"]["mu_qk_after"] < 1e-5
    assert ns["balanced"]["attn_norm_after"] < ns["balanced"]["attn_norm_before"]
    assert ns["change"] < 1e-5
    # Llama with GQA and RoPE: D per group in the query-key circuit, and the same function after balance
    layer = ns["layer"]
    assert (layer["orbit_qk"], layer["orbit_dim_qk"], layer["unidentified_qk"]) == ("rope", 32, 32)
    assert ns["llama_report"]["mu_qk_after"] < 1e-5 < ns["llama_report"]["mu_qk_before"]
    llama_change = (ns["llama_after"] - ns["llama_before"]).abs().max() / ns["llama_before"].abs().max()
    assert float(llama_change) < 1e-5
    assert isinstance(ns["llama_after"], torch.Tensor)


@pytest.mark.slow
def test_the_tables_example_reads_the_smoke_build(tmp_path_factory, shakespeare_url, monkeypatch):
    workdir = shared_smoke_run(tmp_path_factory, shakespeare_url)
    monkeypatch.chdir(workdir)
    blocks = code_blocks(TABLES_SECTION)
    assert len(blocks) == 1
    ns, printed = run_blocks(blocks)
    assert ns["build"] == (workdir / "results" / "smoke").resolve()
    assert {"claims", "cases", "runs", "sweep"} <= set(ns["tables"])
    assert "E1 sgd rho max" in printed and list(ns["claims"]["result"]).count("pass") > 10
