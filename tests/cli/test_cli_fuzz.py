"""Every command on bad paths, bad files and bad values: one line, no traceback, nothing lost (issue 19).

Each case of :data:`CASES` runs one command in-process (``attnid.cli.main``, stderr captured) in
its own copy of a small workspace (a tiny nanoGPT checkpoint, prepared data, a GPT-2 folder,
broken files of every kind) and asserts:

- the exit status is not 0;
- stderr has at most two lines and no ``Traceback``;
- stderr says what is wrong (a fragment of the expected message);
- every file of the workspace is byte-identical afterwards, and no file was added.

The cases are named in docs/development.md ("The command line on bad input").
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from attnid.cli import COMMANDS, main
from attnid.model.gpt import GPT, GPTConfig

UNWRITABLE = "/proc/attnid-fuzz"  # not creatable, even by root
TEXT_CHARS = 30_000  # of tiny shakespeare: enough for the held-out batch and a tiny run


class RunsShell:
    """A pickled object whose unpickling would run ``touch MARKER``."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _gpt2_folder(folder: Path, wrong_shape: bool = False) -> None:
    """A tiny GPT-2 folder (config.json + model.safetensors), written without transformers."""
    from safetensors.torch import save_file

    E, V, P = 8, 65, 16
    folder.mkdir()
    (folder / "config.json").write_text(
        '{"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 8, "vocab_size": 65, "n_positions": 16}'
    )
    generator = torch.Generator().manual_seed(0)
    shapes = {
        "wte.weight": (V, E),
        "wpe.weight": (P, E),
        "ln_f.weight": (E,),
        "ln_f.bias": (E,),
        "h.0.ln_1.weight": (E,),
        "h.0.ln_1.bias": (E,),
        "h.0.ln_2.weight": (E,),
        "h.0.ln_2.bias": (E,),
        "h.0.attn.c_attn.weight": (E, 3 * E if not wrong_shape else 2 * E),
        "h.0.attn.c_attn.bias": (3 * E,),
        "h.0.attn.c_proj.weight": (E, E),
        "h.0.attn.c_proj.bias": (E,),
        "h.0.mlp.c_fc.weight": (E, 4 * E),
        "h.0.mlp.c_fc.bias": (4 * E,),
        "h.0.mlp.c_proj.weight": (4 * E, E),
        "h.0.mlp.c_proj.bias": (E,),
    }
    save_file(
        {name: torch.randn(shape, generator=generator) for name, shape in shapes.items()},
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, shakespeare_path) -> Path:
    """The files every case starts from (copied per case)."""
    from attnid.training.data import prepare

    w = tmp_path_factory.mktemp("fuzz") / "w"
    w.mkdir()
    (w / "text.txt").write_text(shakespeare_path.read_text(encoding="utf-8")[:TEXT_CHARS], encoding="utf-8")
    prepare(w / "text.txt", w / "data")
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=65, n_layer=1, n_head=2, n_embd=8, bias=True))
    checkpoint = {"model": model.state_dict(), "model_args": model.config.model_args()}
    torch.save(checkpoint, w / "ckpt.pt")
    wrong = dict(model.state_dict(), **{"transformer.h.0.attn.c_attn.weight": torch.zeros(20, 8)})
    torch.save({"model": wrong, "model_args": model.config.model_args()}, w / "wrong_shape.pt")
    torch.save({"weights": torch.zeros(3)}, w / "not_nanogpt.pt")
    torch.save(dict(checkpoint, config=RunsShell(str(w / "marker"))), w / "evil.pt")
    (w / "truncated.pt").write_bytes((w / "ckpt.pt").read_bytes()[:3000])
    (w / "empty.pt").write_bytes(b"")
    (w / "noise.bin").write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    (w / "notes.txt").write_text("my notes, not a checkpoint\n")
    (w / "report.json").write_text('{"name": "mine"}\n')
    (w / "main.tex").write_text("\\documentclass{article}\n% my own paper\n")
    (w / "bad.yaml").write_text("max_iters: [1, 2\n")
    (w / "list.yaml").write_text("- 1\n- 2\n")
    (w / "arch.yaml").write_text("architectures:\n  tiny: {n_layer: 1, n_embd: 8, n_head: 2, source: test}\n")
    (w / "counts.csv").write_text("architecture,n_layer,unidentified_qk_per_layer\ntiny,1,8\n")
    (w / "nullity.csv").write_text(
        "case,n_params,n_outputs,theory,measured,gap,passed\npair,30,30,9,9,1e15,True\n"
    )
    (w / "single_head.csv").write_text("label,e0_equal_identified\nE=6,36\n")
    (w / "folder").mkdir()
    (w / "link.pt").symlink_to(w / "ckpt.pt")
    (w / "link_text.txt").symlink_to(w / "text.txt")
    os.link(w / "ckpt.pt", w / "hard.pt")
    _gpt2_folder(w / "hf")
    _gpt2_folder(w / "hf_wrong", wrong_shape=True)
    _gpt2_folder(w / "hf_badjson")
    (w / "hf_badjson" / "config.json").write_text("{oops")
    (w / "nanogpt_data").mkdir()  # nanoGPT's own prepared data: no meta.json of ours
    (w / "nanogpt_data" / "train.bin").write_bytes(np.arange(100, dtype=np.uint16).tobytes())
    (w / "nanogpt_data" / "meta.pkl").write_bytes(b"\x80\x04N.")
    for run, name, content in (
        ("foreign_run", "run.json", '{"mine": 1}\n'),
        ("foreign_ckpt_run", "ckpt.pt", "a note, not a checkpoint\n"),
        ("runs/bad", "run.json", "{oops"),
        ("runs/bad", "metrics.csv", "step,lr\n0,1\n"),
        ("runs/garbled", "run.json", '{"status": "completed", "case": "sgd"}'),
        ("runs/garbled", "metrics.csv", "step,lr\nx,y\n"),
        ("foreign_tables", "sweep.csv", "a,b\n1,2\n"),
    ):
        (w / run).mkdir(parents=True, exist_ok=True)
        (w / run / name).write_text(content)
    return w


APPENDIX = "appendix --counts {w}/counts.csv --nullity {w}/nullity.csv --single-head {w}/single_head.csv"
INPUT = "also an input of this command"
TRAIN = "train --data {w}/data --out {w}/run --max-iters 1 --device cpu"
EDIT = "{w}/ckpt.pt --data {w}/data"
FETCH = "fetch --url {w}/text.txt --sha256 {sha}"
# (name, command line with {w} = the workspace and {sha} = sha256 of text.txt, a fragment of the message)
CASES = [
    ("no-command", "", "required"),
    ("unknown-command", "frobnicate", "invalid choice"),
    # fetch
    ("fetch-out-is-a-directory", FETCH + " --out {w}/folder", "is a directory"),
    ("fetch-out-is-the-source", FETCH + " --out {w}/text.txt", INPUT),
    (
        "fetch-out-is-a-symlink-to-the-source",
        "fetch --url file://{w}/text.txt --sha256 {sha} --out {w}/link_text.txt",
        "same file as the input {w}/text.txt",
    ),
    ("fetch-out-is-a-foreign-file", FETCH + " --out {w}/notes.txt", "--force"),
    ("fetch-out-under-a-file", FETCH + " --out {w}/notes.txt/input.txt", "not a directory"),
    ("fetch-out-unwritable", FETCH + f" --out {UNWRITABLE}/input.txt", "cannot write"),
    ("fetch-sha256-not-hex", "fetch --url {w}/text.txt --sha256 xyz --out {w}/new.txt", "64 hex digits"),
    (
        "fetch-sha256-mismatch",
        "fetch --url {w}/text.txt --sha256 " + "0" * 64 + " --out {w}/new.txt",
        "checksum mismatch",
    ),
    ("fetch-url-missing", "fetch --url {w}/missing.txt --sha256 {sha} --out {w}/new.txt", "not a file"),
    ("fetch-url-is-a-directory", "fetch --url {w}/folder --sha256 {sha} --out {w}/new.txt", "not a file"),
    (
        "fetch-url-scheme",
        "fetch --url ftp://example.org/x --sha256 {sha} --out {w}/new.txt",
        "unsupported URL",
    ),
    ("fetch-timeout-negative", FETCH + " --out {w}/new.txt --timeout -1", "--timeout"),
    ("fetch-timeout-not-a-number", FETCH + " --out {w}/new.txt --timeout soon", "invalid float"),
    # prepare
    ("prepare-text-missing", "prepare --text {w}/missing.txt --out-dir {w}/d", "not found"),
    ("prepare-text-is-a-directory", "prepare --text {w}/folder --out-dir {w}/d", "is a directory"),
    ("prepare-text-binary", "prepare --text {w}/noise.bin --out-dir {w}/d", "not UTF-8"),
    ("prepare-text-empty", "prepare --text {w}/empty.pt --out-dir {w}/d", "0 characters"),
    ("prepare-out-dir-is-a-file", "prepare --text {w}/text.txt --out-dir {w}/notes.txt", "is a file"),
    ("prepare-text-is-an-output", "prepare --text {w}/data/meta.json --out-dir {w}/data", INPUT),
    ("prepare-over-foreign-data", "prepare --text {w}/text.txt --out-dir {w}/nanogpt_data", "--force"),
    # train
    ("train-out-is-a-file", "train --data {w}/data --out {w}/notes.txt --max-iters 1", "is a file"),
    ("train-out-unwritable", f"train --data {{w}}/data --out {UNWRITABLE}/run --max-iters 1", "cannot write"),
    ("train-data-missing", "train --data {w}/nodata --out {w}/run --max-iters 1", "not found"),
    ("train-data-is-a-file", "train --data {w}/notes.txt --out {w}/run --max-iters 1", "not found"),
    ("train-block-size-exceeds-data", TRAIN + " --block-size 100000", "fewer than --block-size"),
    ("train-batch-exceeds-memory", TRAIN + " --batch-size 1000000", "needs about"),  # below the bound
    ("train-model-exceeds-memory", TRAIN + " --n-embd 65536 --n-head 1 --n-layer 64", "needs about"),
    ("train-batch-beyond-bound", TRAIN + " --batch-size 1000000000", "is above its limit of 1048576"),
    ("train-config-is-a-directory", TRAIN + " --config {w}/folder", "is a directory"),
    ("train-config-yaml-syntax", TRAIN + " --config {w}/bad.yaml", "not valid YAML (line 2, column 1)"),
    ("train-config-binary", TRAIN + " --config {w}/noise.bin", "not UTF-8"),
    ("train-config-not-a-mapping", TRAIN + " --config {w}/list.yaml", "mapping"),
    (
        "train-runs-counts-differ",
        "train-runs --data {w}/data --configs {w}/bad.yaml {w}/list.yaml --outs {w}/r",
        "2 --configs and 1 --outs",
    ),
    (
        "train-runs-one-out-twice",
        "train-runs --data {w}/data --configs {w}/bad.yaml {w}/list.yaml --outs {w}/r {w}/r",
        "the same --outs directory",
    ),
    (
        "train-runs-config-yaml-syntax",
        "train-runs --data {w}/data --configs {w}/bad.yaml --outs {w}/r",
        "not valid YAML (line 2, column 1)",
    ),
    ("train-lr-negative", TRAIN + " --lr -1", "positive"),
    ("train-lr-nan", TRAIN + " --lr nan", "positive"),
    ("train-heads-zero", TRAIN + " --n-head 0", "positive"),
    ("train-steps-not-an-integer", TRAIN + " --max-iters 1.5", "invalid int"),
    ("train-case-unknown", TRAIN + " --case sdg", "unknown case"),
    ("train-over-a-foreign-run-json", "train --data {w}/data --out {w}/foreign_run --max-iters 1", "--force"),
    (
        "train-fresh-over-a-foreign-ckpt",
        "train --data {w}/data --out {w}/foreign_ckpt_run --max-iters 1 --fresh",
        "--force",
    ),
    # inspect: checkpoints broken in every way
    ("inspect-missing", "inspect {w}/missing.pt", "does not exist"),
    ("inspect-directory", "inspect {w}/folder", "not a Hugging Face model folder"),
    ("inspect-empty", "inspect {w}/empty.pt", "empty"),
    ("inspect-text-file", "inspect {w}/notes.txt", "text file"),
    ("inspect-json-file", "inspect {w}/report.json", "JSON file"),
    ("inspect-truncated", "inspect {w}/truncated.pt", "truncated or corrupt"),
    ("inspect-random-bytes", "inspect {w}/noise.bin", "not a checkpoint"),
    ("inspect-code-carrying", "inspect {w}/evil.pt", "can run code"),
    (
        "inspect-wrong-shape",
        "inspect {w}/wrong_shape.pt",
        "c_attn.weight has shape (20, 8), expected (24, 8)",
    ),
    ("inspect-not-nanogpt", "inspect {w}/not_nanogpt.pt", "model_args"),
    # prune-biases and balance: outputs that would lose data, broken inputs, bad values
    ("prune-json-is-the-input", "prune-biases " + EDIT + " --out {w}/o.pt --json {w}/ckpt.pt", INPUT),
    ("balance-json-is-the-input", "balance " + EDIT + " --out {w}/o.pt --json {w}/ckpt.pt", INPUT),
    ("prune-out-is-the-input", "prune-biases " + EDIT + " --out {w}/ckpt.pt", INPUT),
    (
        "prune-out-is-a-symlink-to-the-input",
        "prune-biases " + EDIT + " --out {w}/link.pt",
        "same file as the input {w}/ckpt.pt",
    ),
    (
        "prune-out-is-a-hard-link-to-the-input",
        "prune-biases " + EDIT + " --out {w}/hard.pt",
        "same file as the input {w}/ckpt.pt",
    ),
    (
        "prune-json-is-the-held-out-data",
        "prune-biases " + EDIT + " --out {w}/o.pt --json {w}/data/val.bin",
        INPUT,
    ),
    (
        "prune-json-is-the-text",
        "prune-biases {w}/ckpt.pt --text {w}/text.txt --out {w}/o.pt --json {w}/text.txt",
        INPUT,
    ),
    ("prune-out-and-json-one-path", "prune-biases " + EDIT + " --out {w}/o.pt --json {w}/o.pt", "same path"),
    ("prune-out-is-a-foreign-file", "prune-biases " + EDIT + " --out {w}/notes.txt", "--force"),
    (
        "balance-json-is-a-foreign-json",
        "balance " + EDIT + " --out {w}/b.pt --json {w}/report.json",
        "--force",
    ),
    ("prune-out-is-a-directory", "prune-biases " + EDIT + " --out {w}/folder", "is a directory"),
    ("prune-out-under-a-file", "prune-biases " + EDIT + " --out {w}/notes.txt/o.pt", "not a directory"),
    ("prune-out-unwritable", "prune-biases " + EDIT + f" --out {UNWRITABLE}/o.pt", "cannot write"),
    ("prune-empty-checkpoint", "prune-biases {w}/empty.pt --out {w}/o.pt", "empty"),
    ("prune-truncated-checkpoint", "prune-biases {w}/truncated.pt --out {w}/o.pt", "truncated or corrupt"),
    ("balance-code-carrying", "balance {w}/evil.pt --out {w}/o.pt", "can run code"),
    ("prune-folder-not-hf", "prune-biases {w}/folder --out {w}/o", "not a Hugging Face model folder"),
    (
        "prune-hf-wrong-shape",
        "prune-biases {w}/hf_wrong --out {w}/o",
        "h.0.attn.c_attn.weight has shape (8, 16), expected (8, 24) from config.json",
    ),
    ("prune-hf-config-not-json", "prune-biases {w}/hf_badjson --out {w}/o", "not valid JSON"),
    ("prune-hf-out-is-a-file", "prune-biases {w}/hf --out {w}/notes.txt", "is a file"),
    ("prune-hf-out-is-the-input", "prune-biases {w}/hf --out {w}/hf", INPUT),
    ("prune-hf-json-inside-the-input", "prune-biases {w}/hf --out {w}/o --json {w}/hf/config.json", INPUT),
    ("prune-sequences-zero", "prune-biases " + EDIT + " --out {w}/o.pt --sequences 0", "must be positive"),
    (
        "prune-sequences-exceed-memory",
        "prune-biases " + EDIT + " --out {w}/o.pt --sequences 1000000000000",
        "needs about",
    ),
    ("prune-text-binary", "prune-biases {w}/ckpt.pt --text {w}/noise.bin --out {w}/o.pt", "not UTF-8"),
    ("balance-target-unknown", "balance " + EDIT + " --out {w}/o.pt --target sideways", "invalid choice"),
    # counts and verify
    ("counts-architectures-missing", "counts --architectures {w}/missing.yaml --out {w}/c.csv", "not found"),
    ("counts-architectures-directory", "counts --architectures {w}/folder --out {w}/c.csv", "is a directory"),
    (
        "counts-architectures-yaml-syntax",
        "counts --architectures {w}/bad.yaml --out {w}/c.csv",
        "not valid YAML (line 2, column 1)",
    ),
    ("counts-architectures-binary", "counts --architectures {w}/noise.bin --out {w}/c.csv", "not UTF-8"),
    ("counts-out-is-the-input", "counts --architectures {w}/arch.yaml --out {w}/arch.yaml", INPUT),
    (
        "counts-two-outputs-one-path",
        "counts --architectures {w}/arch.yaml --out {w}/c.csv --single-head-out {w}/c.csv",
        "same path",
    ),
    ("counts-out-is-a-foreign-file", "counts --architectures {w}/arch.yaml --out {w}/notes.txt", "--force"),
    ("counts-hf-config-binary", "counts --hf-config {w}/noise.bin", "not valid JSON"),
    ("counts-hf-config-folder-without-config", "counts --hf-config {w}/folder", "not found"),
    ("verify-out-is-a-directory", "verify --out {w}/folder", "is a directory"),
    ("verify-out-is-a-foreign-file", "verify --out {w}/notes.txt", "--force"),
    ("census-out-is-a-directory", "census --out {w}/folder", "is a directory"),
    ("census-out-is-a-foreign-file", "census --out {w}/notes.txt", "--force"),
    ("census-heads-do-not-divide", "census --n-embd 9 --n-head 2", "n_embd"),
    ("census-too-large", "census --n-embd 64 --n-head 4 --vocab-size 65 --max-params 100", "--max-params"),
    # the report commands
    ("tables-no-runs", "tables --out-dir {w}/t", "say which runs"),
    ("tables-run-missing", "tables --runs {w}/nope --out-dir {w}/t", "no run.json"),
    ("tables-run-json-corrupt", "tables --runs {w}/runs/bad --out-dir {w}/t", "cannot read"),
    ("tables-out-dir-is-a-file", "tables --runs {w}/runs/bad --out-dir {w}/notes.txt", "is a file"),
    ("tables-metrics-not-numbers", "tables --runs {w}/runs/garbled --out-dir {w}/t", "not what attnid train"),
    (
        "figures-tables-foreign",
        "figures --tables {w}/foreign_tables --runs {w}/runs/garbled --theory-dir {w} --out-dir {w}/f",
        "not what",
    ),
    (
        "figures-tables-missing",
        "figures --tables {w}/nope --runs-dir {w}/runs --theory-dir {w}/nope --out-dir {w}/f",
        "not found",
    ),
    (
        "report-pages-tables-missing",
        "report-pages --tables {w}/nope --figures {w}/nope --title t --out-dir {w}/r",
        "not found",
    ),
    (
        "report-pages-out-dir-is-a-file",
        "report-pages --tables {w}/nope --figures {w} --title t --out-dir {w}/notes.txt",
        "is a file",
    ),
    ("studies-no-runs", "studies --out-dir {w}/s", "say which runs"),
    ("interventions-table-no-runs", "interventions-table --out-dir {w}/i", "say which runs"),
    ("interventions-table-run-missing", "interventions-table --runs {w}/nope --out-dir {w}/i", "no run.json"),
    (
        "interventions-table-garbled-run",
        "interventions-table --runs {w}/runs/garbled --out-dir {w}/i",
        "has no seed",
    ),
    ("calibration-table-no-runs", "calibration-table --out-dir {w}/c", "say which runs"),
    (
        "calibration-table-pending-spec-is-text",
        "calibration-table --runs {w}/runs/garbled --out-dir {w}/c --pending-specs {w}/notes.txt",
        "no pending spec",
    ),
    (
        "calibration-table-pending-spec-missing",
        "calibration-table --runs {w}/runs/garbled --out-dir {w}/c --pending-specs {w}/nope.yaml",
        "does not exist",
    ),
    (
        "interventions-robustness-no-runs",
        "interventions-robustness --variant final --out-dir {w}/r",
        "lists no runs",
    ),
    (
        "interventions-robustness-garbled-run",
        "interventions-robustness --variant final {w}/runs/garbled --out-dir {w}/r",
        "has no seed",
    ),
    ("edits-table-report-missing", "edits-table --json {w}/nope.json --out-dir {w}/t", "nope.json"),
    ("edits-table-report-is-text", "edits-table --json {w}/notes.txt --out-dir {w}/t", "notes.txt"),
    ("edits-table-report-is-a-checkpoint", "edits-table --json {w}/ckpt.pt --out-dir {w}/t", "ckpt.pt"),
    (
        "edits-table-report-is-foreign-json",
        "edits-table --json {w}/report.json --out-dir {w}/t",
        "report.json",
    ),
    ("appendix-counts-missing", "appendix --counts {w}/nope.csv --out {w}/a.tex", "nope.csv"),
    ("appendix-counts-lack-columns", APPENDIX + " --out {w}/a.tex", "lacks"),
    ("appendix-out-is-an-input", APPENDIX + " --out {w}/nullity.csv", INPUT),
    ("appendix-out-is-a-foreign-tex", APPENDIX + " --out {w}/main.tex", "--force"),
    ("appendix-templates-not-a-folder", APPENDIX + " --templates {w}/notes.txt --out {w}/a.tex", "notes.txt"),
    # align and compare
    ("align-out-is-an-input", "align {w}/ckpt.pt {w}/ckpt.pt --out {w}/ckpt.pt", INPUT),
    ("align-code-carrying", "align {w}/ckpt.pt {w}/evil.pt --out {w}/o.pt", "can run code"),
    ("plant-out-is-an-input", "plant {w}/ckpt.pt --out {w}/ckpt.pt", INPUT),
    ("plant-code-carrying", "plant {w}/evil.pt --out {w}/o.pt", "can run code"),
    ("compare-wrong-shape", "compare {w}/ckpt.pt {w}/wrong_shape.pt", "c_attn.weight has shape (20, 8)"),
    ("compare-classes-unknown", "compare {w}/ckpt.pt {w}/ckpt.pt --classes sideways", "--classes"),
    # barrier and its table
    ("barrier-wrong-shape", "barrier {w}/ckpt.pt {w}/wrong_shape.pt", "c_attn.weight has shape (20, 8)"),
    ("barrier-one-point", "barrier {w}/ckpt.pt {w}/ckpt.pt --points 1", "--points 1"),
    ("alignment-table-missing", "alignment-table --json {w}/missing.json --out-dir {w}/t", "does not exist"),
    ("alignment-table-not-a-report", "alignment-table --json {w}/ckpt.pt --out-dir {w}/t", "ckpt.pt"),
    # the quantization commands
    ("rotate-out-is-a-directory", "rotate " + EDIT + " --out {w}/folder --moves residual", "directory"),
    (
        "rotate-json-is-the-input",
        "rotate " + EDIT + " --out {w}/o.pt --moves residual --json {w}/ckpt.pt",
        INPUT,
    ),
    (
        "rotate-truncated-checkpoint",
        "rotate {w}/truncated.pt --out {w}/o.pt --moves residual",
        "truncated.pt",
    ),
    (
        "rotate-pick-setting-unknown",
        "rotate " + EDIT + " --out {w}/o.pt --moves residual --pick-setting Q4",
        "Q4",
    ),
    ("quant-report-checkpoint-is-text", "quant-report {w}/notes.txt", "notes.txt"),
    ("quant-report-csv-is-the-input", "quant-report " + EDIT + " --csv {w}/ckpt.pt", INPUT),
    ("quant-report-eval-tokens-zero", "quant-report " + EDIT + " --eval-tokens 0", "--eval-tokens"),
    ("from-gguf-file-missing", "from-gguf {w}/nope.gguf --out {w}/g", "nope.gguf"),
    ("from-gguf-file-is-text", "from-gguf {w}/notes.txt --out {w}/g", "notes.txt"),
    (
        "quantization-table-report-is-text",
        "quantization-table --json {w}/notes.txt --out-dir {w}/t",
        "notes.txt",
    ),
    (
        "quantization-table-report-is-foreign-json",
        "quantization-table --json {w}/report.json --out-dir {w}/t",
        "report.json",
    ),
]


def _snapshot(root: Path) -> dict[str, str]:
    """Every file below ``root`` (symlinks as their target's path), by content."""
    return {
        str(p.relative_to(root)): (f"-> {os.readlink(p)}" if p.is_symlink() else _sha256(p))
        for p in sorted(root.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


def test_the_table_is_large_and_names_are_unique():
    names = [name for name, _, _ in CASES]
    assert len(names) >= 40 and len(set(names)) == len(names)
    # every command has cases
    first_words = {command.split()[0] for _, command, _ in CASES if command}
    assert set(COMMANDS) - first_words == set()


def test_every_case_is_named_in_the_docs(repo_root):
    text = (repo_root / "docs" / "development.md").read_text(encoding="utf-8")
    assert [name for name, _, _ in CASES if f"`{name}`" not in text] == []


@pytest.fixture(scope="module")
def shared_copy(workspace, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """One copy of the workspace for every case, and its snapshot: a case that fails leaves it as it was,
    and one that does not is reported and the copy restored, so the cases stay independent."""
    copy = tmp_path_factory.mktemp("fuzz_copy") / "w"
    _copy_workspace(workspace, copy)
    return copy, _snapshot(copy)


def _copy_workspace(workspace: Path, copy: Path) -> None:
    """A copy whose links link inside it."""
    shutil.copytree(workspace, copy, symlinks=True)
    (copy / "hard.pt").unlink()
    os.link(copy / "ckpt.pt", copy / "hard.pt")
    for link, target in (("link.pt", "ckpt.pt"), ("link_text.txt", "text.txt")):
        (copy / link).unlink()
        (copy / link).symlink_to(copy / target)


@pytest.mark.parametrize("name, command, expected", CASES, ids=[case[0] for case in CASES])
def test_bad_input_is_one_line_and_loses_nothing(
    name, command, expected, workspace, shared_copy, capsys, monkeypatch
):
    w, before = shared_copy
    monkeypatch.chdir(w)  # default output paths (results/...) land in the copy
    argv = shlex.split(command.format(w=w, sha=_sha256(w / "text.txt")))
    expected = expected.format(w=w)
    try:
        status = main(argv)
    except SystemExit as stop:  # argparse
        status = stop.code
    err = capsys.readouterr().err
    after = _snapshot(w)
    if after != before or (w / "marker").exists():
        shutil.rmtree(w)  # the next case starts from the workspace again
        _copy_workspace(workspace, w)
    lines = err.strip().splitlines()
    assert after == before, f"{name}: files changed: {sorted(set(after.items()) ^ set(before.items()))}"
    assert status not in (0, None), f"{name}: exit status {status}, stderr {err!r}"
    assert "Traceback" not in err and 1 <= len(lines) <= 2, f"{name}: {err!r}"
    assert expected in err, f"{name}: expected {expected!r} in {err!r}"
    assert not (w / "marker").exists(), f"{name}: a pickle's code ran"


# --------------------------------------------------------------------------------------
# what is not refused: a command's own earlier outputs, and --force
# --------------------------------------------------------------------------------------


def _run(*argv) -> int:
    return main([str(a) for a in argv])


def test_reruns_overwrite_their_own_outputs(workspace, tmp_path, capsys, monkeypatch):
    """The pipeline's reruns: every command may write over what it wrote before, without --force."""
    w = workspace
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    for _ in range(2):
        assert (
            _run(
                "fetch", "--url", w / "text.txt", "--sha256", _sha256(w / "text.txt"), "--out", out / "t.txt"
            )
            == 0
        )
        assert _run("prepare", "--text", out / "t.txt", "--out-dir", out / "data") == 0
        assert (
            _run(
                "prune-biases",
                w / "ckpt.pt",
                "--data",
                out / "data",
                "--out",
                out / "p.pt",
                "--json",
                out / "p.json",
            )
            == 0
        )
        assert (
            _run("balance", w / "hf", "--out", out / "hf", "--json", out / "b.json", "--sequences", "2") == 0
        )
        assert (
            _run(
                "counts",
                "--architectures",
                w / "arch.yaml",
                "--out",
                out / "c.csv",
                "--single-head-out",
                out / "s.csv",
            )
            == 0
        )
        assert _run("edits-table", "--json", out / "p.json", out / "b.json", "--out-dir", out / "tables") == 0
        assert (
            _run(
                "train",
                "--data",
                out / "data",
                "--out",
                out / "run",
                "--max-iters",
                "2",
                "--n-layer",
                "1",
                "--n-embd",
                "8",
                "--n-head",
                "2",
                "--block-size",
                "8",
                "--batch-size",
                "2",
                "--eval-iters",
                "1",
                "--fresh",
            )
            == 0
        )
    assert "error" not in capsys.readouterr().err


def test_force_replaces_a_foreign_file_but_never_an_input(workspace, tmp_path, capsys):
    w = tmp_path / "w"
    shutil.copytree(workspace, w)
    notes = (w / "notes.txt").read_bytes()
    assert _run("prune-biases", w / "ckpt.pt", "--data", w / "data", "--out", w / "notes.txt") == 2
    assert (w / "notes.txt").read_bytes() == notes and "--force" in capsys.readouterr().err
    assert _run("prune-biases", w / "ckpt.pt", "--data", w / "data", "--out", w / "notes.txt", "--force") == 0
    assert (w / "notes.txt").read_bytes().startswith(b"PK")  # now the edited checkpoint
    before = (w / "ckpt.pt").read_bytes()
    assert (
        _run(
            "prune-biases",
            w / "ckpt.pt",
            "--data",
            w / "data",
            "--out",
            w / "o.pt",
            "--json",
            w / "ckpt.pt",
            "--force",
        )
        == 2
    )
    assert (w / "ckpt.pt").read_bytes() == before and "input" in capsys.readouterr().err


def test_an_interrupted_prepare_is_refused_by_training_and_rerun_without_force(workspace, tmp_path, capsys):
    from attnid.training import data

    out = tmp_path / "data"
    shutil.copytree(workspace / "data", out)
    (out / "meta.json").write_text(__import__("json").dumps(data.INCOMPLETE_META))  # killed after this write
    assert _run("train", "--data", out, "--out", tmp_path / "run", "--max-iters", "1") == 2
    assert "interrupted" in capsys.readouterr().err
    assert _run("prepare", "--text", workspace / "text.txt", "--out-dir", out) == 0
    assert data.load_meta(out)["vocab_size"] > 0


# --------------------------------------------------------------------------------------
# the one-line rule itself: OSErrors, bugs, ATTNID_DEBUG, progress
# --------------------------------------------------------------------------------------


def test_an_oserror_is_one_line_naming_the_path_and_a_bug_keeps_its_traceback(monkeypatch, capsys, tmp_path):
    import attnid.cli.theory as theory

    def denied(args):
        raise PermissionError(13, "Permission denied", str(tmp_path / "x.csv"))

    monkeypatch.setattr(theory, "run_verify", denied)
    assert _run("verify", "--out", tmp_path / "x.csv") == 2
    err = capsys.readouterr().err
    assert err == f"attnid verify: error: {tmp_path / 'x.csv'}: Permission denied\n"
    monkeypatch.setenv("ATTNID_DEBUG", "1")  # the traceback on demand, then the same line
    assert _run("verify", "--out", tmp_path / "x.csv") == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.endswith("Permission denied\n")

    def bug(args):
        raise ZeroDivisionError("ours")

    monkeypatch.setattr(theory, "run_verify", bug)
    with pytest.raises(ZeroDivisionError):  # our own bug: not dressed up as the user's mistake
        _run("verify", "--out", tmp_path / "x.csv")


def test_a_silent_command_reports_progress(monkeypatch, capsys, tmp_path):
    import time

    import attnid.cli.theory as theory
    from attnid.common import progress

    def slow(args):
        progress.stage("measuring something slow")
        time.sleep(1.6)
        return 0

    monkeypatch.setenv(progress.SILENCE_ENV, "0.5")
    monkeypatch.setattr(theory, "run_verify", slow)
    assert _run("verify", "--out", tmp_path / "x.csv") == 0
    lines = capsys.readouterr().err.splitlines()
    assert 1 <= len(lines) <= 3 and all(
        "attnid verify: still working: measuring something slow" in line for line in lines
    ), lines


def test_a_command_that_names_no_stage_says_computing_once_loaded(monkeypatch, capsys, tmp_path):
    import time

    import attnid.cli.theory as theory
    from attnid.common import progress

    def silent(args):
        time.sleep(1.6)
        return 0

    monkeypatch.setenv(progress.SILENCE_ENV, "0.5")
    monkeypatch.setattr(theory, "run_verify", silent)
    assert _run("verify", "--out", tmp_path / "x.csv") == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines and all("attnid verify: still working: computing (" in line for line in lines), lines
