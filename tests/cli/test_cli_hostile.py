"""Every command against a hostile user's inputs (issue 29): folders that name files outside themselves,
FIFOs, devices, sockets and symlink loops, declared sizes that would hang, values that are not numbers or
not finite, broken side files; plus two writers of one output, a failing disk, a closed pipe and Ctrl-C.

Each case of :data:`CASES` runs one command in-process (``attnid.cli.main``, stderr captured) in one
workspace and asserts, like ``tests/cli/test_cli_fuzz.py``:

- the exit status is not 0, within :data:`CASE_SECONDS` (an alarm stops a case that hangs);
- stderr is one line with no ``Traceback``, and names the cause (a fragment of the expected message;
  and, for a device, no advice to pass ``--force``);
- every file of the workspace is byte-identical afterwards, every special file is still what it was,
  nothing was added, and ``/etc/passwd`` (which one folder names) is untouched.

The classes are listed in docs/development.md ("The command line on bad input").
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import attnid
from attnid.cli import main
from attnid.common import interrupts
from attnid.model.gpt import GPT, GPTConfig

CASE_SECONDS = 30
TEXT_CHARS = 30_000
OUTSIDE = "/etc/passwd"  # a file outside every workspace that a hostile index names


class CaseTimeout(Exception):
    pass


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tiny_state(vocab_size: int = 65, **config) -> tuple[dict, dict]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=vocab_size, n_layer=1, n_head=2, n_embd=8, **config))
    return model.state_dict(), model.config.model_args()


def _gpt2_tensors() -> dict[str, torch.Tensor]:
    E, V, P = 8, 65, 16
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
        "h.0.attn.c_attn.weight": (E, 3 * E),
        "h.0.attn.c_attn.bias": (3 * E,),
        "h.0.attn.c_proj.weight": (E, E),
        "h.0.attn.c_proj.bias": (E,),
        "h.0.mlp.c_fc.weight": (E, 4 * E),
        "h.0.mlp.c_fc.bias": (4 * E,),
        "h.0.mlp.c_proj.weight": (4 * E, E),
        "h.0.mlp.c_proj.bias": (E,),
    }
    return {name: torch.randn(shape, generator=generator) for name, shape in shapes.items()}


GPT2_CONFIG = {
    "model_type": "gpt2",
    "n_layer": 1,
    "n_head": 2,
    "n_embd": 8,
    "vocab_size": 65,
    "n_positions": 16,
}


def _gpt2_folder(folder: Path, shards: dict[str, str] | None = None) -> None:
    """A tiny GPT-2 folder; ``shards`` maps a tensor-name prefix to the file the index names for it (the
    file itself is not written here)."""
    from safetensors.torch import save_file

    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GPT2_CONFIG))
    tensors = _gpt2_tensors()
    if shards is None:
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {name: next(f for p, f in shards.items() if name.startswith(p)) for name in tensors}
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )


def _build(w: Path, shakespeare_path: Path) -> None:
    """The workspace: good inputs, hostile folders and files, and special files."""
    from safetensors.torch import save_file

    from attnid.training.data import prepare

    w.mkdir(parents=True)
    (w / "text.txt").write_text(shakespeare_path.read_text(encoding="utf-8")[:TEXT_CHARS], encoding="utf-8")
    prepare(w / "text.txt", w / "data")
    state, args = _tiny_state(bias=True)
    torch.save({"model": state, "model_args": args}, w / "ckpt.pt")
    key = "transformer.h.0.attn.c_attn.weight"
    for name, value in (("nan", float("nan")), ("inf", float("inf"))):
        bad = dict(state, **{key: state[key].clone().fill_(value)})
        torch.save({"model": bad, "model_args": args}, w / f"{name}.pt")
    for name, dtype in (("int8", torch.int8), ("complex", torch.complex64)):
        torch.save(
            {"model": dict(state, **{key: state[key].to(dtype)}), "model_args": args}, w / f"{name}.pt"
        )
    for name, changed in (
        ("layers_1e9", {"n_layer": 10**9}),
        ("head_dim_string", {"head_dim": "4"}),
        ("dropout_string", {"dropout": "0.1"}),
        ("vocab_beyond_limit", {"vocab_size": 2**40}),
    ):
        torch.save({"model": state, "model_args": dict(args, **changed)}, w / f"{name}.pt")
    torch.save({"model": {**state, 0: state[key]}, "model_args": args}, w / "int_keys.pt")
    small_state, small_args = _tiny_state(vocab_size=10, bias=True)
    torch.save({"model": small_state, "model_args": small_args}, w / "small_vocab.pt")
    # Hugging Face folders that name files outside themselves
    save_file(_gpt2_tensors(), str(w / "victim.safetensors"), metadata={"format": "pt"})
    _gpt2_folder(w / "hf_parent", {"": "../victim.safetensors"})
    _gpt2_folder(w / "hf_abs", {"": str(w / "victim.safetensors")})
    _gpt2_folder(w / "hf_etc", {"": OUTSIDE})
    _gpt2_folder(w / "hf_not_a_name", {"": "model.safetensors"})
    index = json.loads((w / "hf_not_a_name" / "model.safetensors.index.json").read_text())
    index["weight_map"]["wte.weight"] = 5
    (w / "hf_not_a_name" / "model.safetensors.index.json").write_text(json.dumps(index))
    _gpt2_folder(w / "hf_link_weights", {"": "model.safetensors"})
    (w / "hf_link_weights" / "model.safetensors").symlink_to(w / "victim.safetensors")
    (w / "secret.txt").write_text("the user's secret, outside every model folder\n")
    _gpt2_folder(w / "hf_link_extra")
    (w / "hf_link_extra" / "tokenizer_config.json").symlink_to(w / "secret.txt")
    _gpt2_folder(w / "hf_link_config")
    (w / "hf_link_config" / "config.json").unlink()
    (w / "config_elsewhere.json").write_text(json.dumps(GPT2_CONFIG))
    (w / "hf_link_config" / "config.json").symlink_to(w / "config_elsewhere.json")
    _gpt2_folder(w / "hf_bad_tokenizer")
    (w / "hf_bad_tokenizer" / "tokenizer.json").write_text("{oops, not a tokenizer")
    (w / "llama_rotary").mkdir()
    (w / "llama_rotary" / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 8,
                "num_attention_heads": 2,
                "num_hidden_layers": 1,
                "vocab_size": 65,
                "max_position_embeddings": 16,
                "partial_rotary_factor": "half",
            }
        )
    )
    (w / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (w / "bomb.yaml").write_text(
        'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
        + "".join(
            f"{level}: &{level} [{', '.join([f'*{previous}'] * 9)}]\n"
            for previous, level in zip("abcdefgh", "bcdefghi")
        )
    )
    (w / "arch.yaml").write_text("architectures:\n  tiny: {n_layer: 1, n_embd: 8, n_head: 2, source: test}\n")
    shutil.copytree(w / "data", w / "data_bad_meta")
    meta = json.loads((w / "data_bad_meta" / "meta.json").read_text())
    (w / "data_bad_meta" / "meta.json").write_text(json.dumps(dict(meta, train_tokens="many")))
    run = {"status": "completed", "case": "sgd", "lr": 0.1, "seed": 0, "steps_completed": 2}
    for name, content in (("ok", run), ("lr_text", dict(run, lr="fast"))):
        (w / "runs" / name).mkdir(parents=True)
        (w / "runs" / name / "run.json").write_text(json.dumps(content))
        (w / "runs" / name / "metrics.csv").write_text("step,lr,train_loss\n0,0.1,4.0\n2,0.1,3.0\n")
    # special files
    os.mkfifo(w / "fifo")
    (w / "runs" / "fifo_run").mkdir()
    os.mkfifo(w / "runs" / "fifo_run" / "run.json")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(w / "sock"))
    (w / "loop").symlink_to(w / "loop")
    if os.geteuid() == 0:  # a device of our own, harmless to lose if the rule ever broke
        os.mknod(w / "dev", stat.S_IFCHR | 0o666, os.makedev(1, 3))


def _device(w: Path) -> str:
    """A character device: our own copy of /dev/null as root, else /dev/null (which a user cannot replace)."""
    return str(w / "dev") if (w / "dev").exists() else "/dev/null"


def _snapshot(root: Path) -> dict[str, str]:
    """Every entry below ``root``: files by content, symlinks by target, special files by kind; and
    ``/etc/passwd`` by content."""
    entries = {OUTSIDE: _sha256(Path(OUTSIDE))}
    for path in sorted(root.rglob("*")):
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            entries[str(path.relative_to(root))] = f"-> {os.readlink(path)}"
        elif stat.S_ISREG(mode):
            entries[str(path.relative_to(root))] = _sha256(path)
        elif not stat.S_ISDIR(mode):
            entries[str(path.relative_to(root))] = f"special {stat.S_IFMT(mode)}"
    return entries


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, shakespeare_path) -> tuple[Path, dict[str, str], Path]:
    root = tmp_path_factory.mktemp("hostile")
    w = root / "w"
    _build(w, shakespeare_path)
    return w, _snapshot(w), shakespeare_path


TRAIN = "train --data {w}/data --out {w}/run --max-iters 1 --device cpu"
EDIT = "{w}/ckpt.pt --data {w}/data"
FETCH = "fetch --url {w}/text.txt --sha256 {sha}"
COUNTS = "counts --architectures {w}/arch.yaml"
# (name, command line with {w} = the workspace, {dev} = a character device, {sha} = text.txt's sha256;
#  a fragment of the expected message; a fragment it must not contain, or None)
CASES = [
    # containment: a folder names files outside itself
    (
        "balance-hf-index-names-a-parent-file",
        "balance {w}/hf_parent --out {w}/o",
        "'../victim.safetensors'",
        None,
    ),
    (
        "prune-hf-index-names-an-absolute-path",
        "prune-biases {w}/hf_abs --out {w}/o",
        "an absolute path",
        None,
    ),
    ("inspect-hf-index-names-etc-passwd", "inspect {w}/hf_etc", "'/etc/passwd', an absolute path", None),
    (
        "prune-hf-index-entry-not-a-name",
        "prune-biases {w}/hf_not_a_name --out {w}/o",
        "not a file name",
        None,
    ),
    ("inspect-hf-weights-link-out-of-the-folder", "inspect {w}/hf_link_weights", "outside", None),
    ("balance-hf-file-link-out-of-the-folder", "balance {w}/hf_link_extra --out {w}/o", "outside", None),
    ("inspect-hf-config-link-out-of-the-folder", "inspect {w}/hf_link_config", "outside", None),
    # FIFOs, devices, sockets, symlink loops: refused before opening, --force never replaces them
    ("fetch-url-fifo", "fetch --url file://{w}/fifo --sha256 {sha} --out {w}/new.txt", "FIFO", None),
    ("fetch-url-device", "fetch --url /dev/zero --sha256 {sha} --out {w}/new.txt", "character device", None),
    ("fetch-out-fifo", FETCH + " --out {w}/fifo", "FIFO", "--force"),
    ("counts-out-device", COUNTS + " --out {dev}", "character device", "--force"),
    ("counts-out-device-with-force", COUNTS + " --out {dev} --force", "character device", "--force"),
    ("counts-out-socket", COUNTS + " --out {w}/sock", "socket", "--force"),
    ("verify-out-fifo-with-force", "verify --out {w}/fifo --force", "FIFO", None),
    ("inspect-plot-fifo", "inspect {w}/ckpt.pt --plot {w}/fifo", "FIFO", None),
    ("prune-json-fifo", "prune-biases " + EDIT + " --out {w}/o.pt --json {w}/fifo", "FIFO", None),
    ("prune-text-fifo", "prune-biases {w}/ckpt.pt --text {w}/fifo --out {w}/o.pt", "FIFO", "not found"),
    ("inspect-checkpoint-fifo", "inspect {w}/fifo", "FIFO", "empty"),
    ("inspect-checkpoint-dev-zero", "inspect /dev/zero", "character device", "empty"),
    ("prepare-text-fifo", "prepare --text {w}/fifo --out-dir {w}/d", "FIFO", None),
    ("train-config-fifo", TRAIN + " --config {w}/fifo", "FIFO", None),
    ("counts-hf-config-fifo", "counts --hf-config {w}/fifo", "FIFO", None),
    ("tables-run-json-fifo", "tables --runs {w}/runs/fifo_run --out-dir {w}/t", "FIFO", None),
    ("tables-runs-dir-holds-a-fifo", "tables --runs-dir {w}/runs --out-dir {w}/t", "FIFO", None),
    ("train-out-symlink-loop", "train --data {w}/data --out {w}/loop --max-iters 1", "symlink loop", None),
    ("prune-out-symlink-loop", "prune-biases " + EDIT + " --out {w}/loop", "symlink loop", None),
    # declared sizes checked before anything is allocated or iterated
    ("inspect-model-args-a-billion-layers", "inspect {w}/layers_1e9.pt", "n_layer=1000000000", None),
    ("prune-model-args-a-billion-layers", "prune-biases {w}/layers_1e9.pt --out {w}/o.pt", "n_layer", None),
    ("inspect-model-args-vocab-beyond-limit", "inspect {w}/vocab_beyond_limit.pt", "vocab_size", None),
    ("train-eval-iters-huge", TRAIN + " --eval-iters 300000000", "--eval-iters", None),
    ("train-metrics-threads-huge", TRAIN + " --metrics-threads 100000", "--metrics-threads", None),
    ("train-threads-huge", TRAIN + " --threads 100000", "--threads", None),
    ("train-a-billion-layers", TRAIN + " --n-layer 1000000000", "above its limit of 1024", None),
    ("train-a-thousand-wide-layers", TRAIN + " --n-layer 1024 --n-embd 65536", "needs about", None),
    ("census-threads-huge", "census --threads 100000", "threads must be from 1", None),
    # values: weights, model_args, flags, seeds, config and run files
    ("inspect-nan-weights", "inspect {w}/nan.pt", "NaN", None),
    ("balance-inf-weights", "balance {w}/inf.pt --data {w}/data --out {w}/o.pt", "infinite", None),
    ("prune-nan-weights", "prune-biases {w}/nan.pt --data {w}/data --out {w}/o.pt", "NaN", None),
    ("inspect-int8-weights", "inspect {w}/int8.pt", "stored as int8", None),
    ("prune-complex-weights", "prune-biases {w}/complex.pt --out {w}/o.pt", "stored as complex64", None),
    ("inspect-model-args-head-dim-string", "inspect {w}/head_dim_string.pt", "head_dim='4'", None),
    ("inspect-model-args-dropout-string", "inspect {w}/dropout_string.pt", "dropout='0.1'", None),
    ("inspect-integer-state-dict-keys", "inspect {w}/int_keys.pt", "under the key 0", None),
    (
        "prune-text-beyond-the-vocabulary",
        "prune-biases {w}/small_vocab.pt --data {w}/data --text {w}/text.txt --out {w}/o.pt",
        "beyond the model's vocabulary of 10",
        None,
    ),
    (
        "prune-hf-broken-tokenizer",
        "prune-biases {w}/hf_bad_tokenizer --text {w}/text.txt --out {w}/o",
        "tokenizer files",
        None,
    ),
    (
        "prune-llama-partial-rotary-string",
        "prune-biases {w}/llama_rotary --out {w}/o",
        "partial_rotary",
        None,
    ),
    ("counts-hf-config-nested-deeply", "counts --hf-config {w}/deep.json", "nested too deeply", None),
    ("train-config-alias-bomb", TRAIN + " --config {w}/bomb.yaml", "alias bomb", None),
    ("train-seed-beyond-64-bits", TRAIN + " --seed 18446744073709551616", "--seed", None),
    ("train-seed-negative", TRAIN + " --seed -1", "--seed", None),
    ("census-seed-beyond-64-bits", "census --seed 18446744073709551616", "a seed must be", None),
    ("verify-threads-zero", "verify --out {w}/n.csv --threads 0", "threads must be from 1", None),
    ("census-threads-negative", "census --threads -2", "threads must be from 1", None),
    ("train-min-lr-nan", TRAIN + " --min-lr nan", "--min-lr", None),
    ("train-min-lr-negative", TRAIN + " --min-lr -0.1", "--min-lr", None),
    ("train-momentum-inf", TRAIN + " --case sgd_momentum --momentum inf", "--momentum", None),
    ("train-weight-decay-inf", TRAIN + " --weight-decay inf", "--weight-decay", None),
    (
        "train-meta-token-count-not-a-number",
        "train --data {w}/data_bad_meta --out {w}/run",
        "train_tokens",
        None,
    ),
    ("fetch-timeout-infinite", FETCH + " --out {w}/new.txt --timeout inf", "--timeout", None),
    ("tables-same-run-twice", "tables --runs {w}/runs/ok {w}/runs/ok --out-dir {w}/t", "listed twice", None),
    (
        "tables-run-json-lr-not-a-number",
        "tables --runs {w}/runs/lr_text --out-dir {w}/t",
        "lr is 'fast'",
        None,
    ),
    # the quantization commands: the same containment, special files, values, and what the census refuses
    (
        "rotate-hf-index-names-a-parent-file",
        "rotate {w}/hf_parent --out {w}/o --moves residual",
        "'../victim.safetensors'",
        None,
    ),
    (
        "rotate-hf-file-link-out-of-the-folder",
        "rotate {w}/hf_link_extra --out {w}/o --moves ov",
        "outside",
        None,
    ),
    (
        "rotate-out-is-the-input",
        "rotate " + EDIT + " --out {w}/ckpt.pt --moves residual",
        "also an input",
        None,
    ),
    (
        "rotate-inf-weights",
        "rotate {w}/inf.pt --data {w}/data --out {w}/o.pt --moves residual",
        "infinite",
        None,
    ),
    ("rotate-text-fifo", "rotate " + EDIT + " --text {w}/fifo --out {w}/o.pt --moves ov", "FIFO", None),
    ("rotate-move-unknown", "rotate " + EDIT + " --out {w}/o.pt --moves spin", "choose among", None),
    (
        "rotate-keep-tied-residual",
        "rotate " + EDIT + " --out {w}/o.pt --moves residual --keep-tied",
        "stream_rotation",
        None,
    ),
    (
        "quant-report-hf-index-names-a-parent-file",
        "quant-report {w}/hf_parent",
        "'../victim.safetensors'",
        None,
    ),
    ("quant-report-nan-weights", "quant-report {w}/nan.pt --data {w}/data", "NaN", None),
    ("quant-report-json-fifo", "quant-report " + EDIT + " --json {w}/fifo", "FIFO", None),
    ("quant-report-setting-unknown", "quant-report " + EDIT + " --settings W4x", "expected W<bits>", None),
    ("from-gguf-file-fifo", "from-gguf {w}/fifo --out {w}/o", "FIFO", None),
]


def _alarm(signum, frame):
    raise CaseTimeout(f"more than {CASE_SECONDS} s")


def test_the_cases_are_named_in_the_docs_and_unique(repo_root):
    names = [case[0] for case in CASES]
    assert len(set(names)) == len(names)
    text = (repo_root / "docs" / "development.md").read_text(encoding="utf-8")
    assert [name for name in names if f"`{name}`" not in text] == []


@pytest.mark.parametrize("name, command, expected, absent", CASES, ids=[case[0] for case in CASES])
def test_hostile_input_is_one_line_and_touches_nothing(
    name, command, expected, absent, hostile, tmp_path_factory, capsys, monkeypatch
):
    w, before, shakespeare_path = hostile
    monkeypatch.chdir(w)
    argv = shlex.split(command.format(w=w, dev=_device(w), sha=_sha256(w / "text.txt")))
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    started = time.monotonic()
    try:
        status = main(argv)
    except SystemExit as stop:  # argparse
        status = stop.code
    except CaseTimeout:
        status = "hung"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    seconds = time.monotonic() - started
    err = capsys.readouterr().err
    after = _snapshot(w)
    if after != before:  # the next case starts from the workspace again
        shutil.rmtree(w)
        _build(w, shakespeare_path)
    lines = err.strip().splitlines()
    assert after == before, f"{name}: changed: {sorted(set(after.items()) ^ set(before.items()))}"
    assert status not in (0, None, "hung"), f"{name}: exit status {status} after {seconds:.0f} s, {err!r}"
    assert "Traceback" not in err and len(lines) == 1, f"{name}: {err!r}"
    assert expected in err, f"{name}: expected {expected!r} in {err!r}"
    assert absent is None or absent not in err, f"{name}: {absent!r} in {err!r}"


# --------------------------------------------------------------------------------------
# one writer per output: two real processes
# --------------------------------------------------------------------------------------

TINY_TRAIN = ["--n-layer", "1", "--n-embd", "8", "--n-head", "2", "--block-size", "8", "--batch-size", "2"]
TINY_TRAIN += ["--eval-iters", "1", "--device", "cpu", "--metrics-threads", "0"]


def _attnid(*argv: str | Path, **kwargs) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(Path(attnid.__file__).resolve().parents[1]))  # the tested attnid
    return subprocess.Popen(
        [sys.executable, "-m", "attnid", *map(str, argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **kwargs,
    )


def _wait_for(path: Path, process: subprocess.Popen, seconds: float = 60) -> str:
    """The content of ``path`` once it has some (a lock file with its holder's pid)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.is_file() and path.read_text().strip():
            return path.read_text().strip()
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def test_a_second_writer_of_a_run_directory_is_refused_and_a_killed_ones_lock_is_taken_over(
    tmp_path, hostile
):
    w = hostile[0]
    run = tmp_path / "run"
    first = _attnid("train", "--data", w / "data", "--out", run, "--max-iters", "1000000", *TINY_TRAIN)
    try:
        holder = _wait_for(run / ".attnid.lock", first)
        assert holder == str(first.pid)
        second = _attnid("train", "--data", w / "data", "--out", run, "--max-iters", "1000000", *TINY_TRAIN)
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2 and len(err.strip().splitlines()) == 1, err
        assert f"pid {first.pid}" in err and "being written by another attnid" in err, err
        assert first.poll() is None  # the holder runs on, undisturbed
    finally:
        first.kill()  # SIGKILL: no handler runs, the lock file stays behind with its pid
        first.communicate()
    assert (run / ".attnid.lock").read_text().strip() == str(first.pid)
    assert _train(w, run, "--max-iters", "3", "--fresh") == 0  # this process takes the stale lock over
    assert json.loads((run / "run.json").read_text())["status"] == "completed"
    assert not (run / ".attnid.lock").exists()  # given back at the end


def test_a_second_writer_of_an_edit_output_file_is_refused(tmp_path, hostile):
    from attnid.common import outputs
    from attnid.common.errors import UserError

    w = hostile[0]
    holder = outputs.OutputRule("prune-biases")
    holder.write(tmp_path / "o.pt", outputs.TORCH_ARCHIVE, "--out")
    try:
        second = _attnid("prune-biases", w / "ckpt.pt", "--data", w / "data", "--out", tmp_path / "o.pt")
        _, err = second.communicate(timeout=120)
        assert (
            second.returncode == 2 and f"pid {os.getpid()}" in err and len(err.strip().splitlines()) == 1
        ), err
        with pytest.raises(UserError, match="being written by another attnid"):
            outputs.OutputRule("balance").write(tmp_path / "o.pt", outputs.TORCH_ARCHIVE, "--out")
    finally:
        holder.release()
    assert not (tmp_path / "o.pt").exists() and sorted(os.listdir(tmp_path)) == []


# --------------------------------------------------------------------------------------
# robust I/O: a failing disk, a closed pipe, Ctrl-C
# --------------------------------------------------------------------------------------


def _file_size_limit(limit: int):
    """A child whose writes beyond ``limit`` bytes fail as a full disk's do (EFBIG instead of ENOSPC),
    without needing a small filesystem."""
    import resource

    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    return apply


@pytest.mark.parametrize("source", ["ckpt.pt", "hf_link_extra"])
def test_a_write_that_fails_is_one_line_and_leaves_no_partial_output(tmp_path, hostile, source):
    w = hostile[0]
    if source == "hf_link_extra":  # a good folder: the hostile one without its link
        shutil.copytree(w / source, tmp_path / "hf", ignore=shutil.ignore_patterns("tokenizer_config.json"))
        source_path, out = tmp_path / "hf", tmp_path / "out"
    else:
        source_path, out = w / source, tmp_path / "o.pt"
    command = [
        "prune-biases",
        source_path,
        "--text",
        w / "text.txt",
        "--out",
        out,
        "--json",
        tmp_path / "o.json",
    ]
    process = _attnid(*command, preexec_fn=_file_size_limit(4000))
    _, err = process.communicate(timeout=120)
    assert process.returncode == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "File too large" in err, err
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if not p.is_dir())
    assert [p for p in left if not p.startswith("hf/")] == []  # no output, no temporary file


def test_a_closed_pipe_ends_inspect_quietly(hostile):
    w = hostile[0]
    process = _attnid("inspect", w / "ckpt.pt", "--csv")
    assert process.stdout is not None
    process.stdout.close()  # the reader is gone before anything is printed: `attnid inspect ... | head -0`
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGPIPE and err == "", err


def _wait_until_importing_torch(process: subprocess.Popen, timeout: float = 60.0) -> None:
    """Return once the process has mapped libtorch (it is importing torch, before any command code runs). A
    fixed sleep is not that: on a fast machine with a warm cache 0.3 s was already past the run's first line.
    Without /proc (not Linux) it falls back to such a sleep."""
    maps = Path(f"/proc/{process.pid}/maps")
    if not maps.exists():
        time.sleep(0.3)
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if "libtorch" in maps.read_text():
                return
        except OSError:
            return
        time.sleep(0.002)


def test_ctrl_c_while_starting_is_one_line(hostile, tmp_path):
    w = hostile[0]
    # SIGINT at its default, as under a terminal: a suite started in the background (a CI job without job
    # control) hands its children SIGINT ignored, and a command that inherits it so rightly keeps ignoring it
    process = _attnid(
        "train",
        "--data",
        w / "data",
        "--out",
        tmp_path / "run",
        *TINY_TRAIN,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    _wait_until_importing_torch(process)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130 and err.strip() == "attnid train: interrupted", err
    assert not (tmp_path / "run").exists()


def test_a_ctrl_c_that_a_library_swallows_still_stops_the_command():
    """A KeyboardInterrupt raised inside a third-party ``except BaseException`` while torch imports is
    remembered and raised again before the command's work (attnid.common.interrupts); the handler that
    SIGINT had comes back after."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        with interrupts.recorded():
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # the handler runs in this, the main, thread
            except BaseException:  # noqa: BLE001 - a library that swallows everything
                pass
            with pytest.raises(KeyboardInterrupt):
                interrupts.stop_if_received()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with interrupts.recorded():
            interrupts.stop_if_received()  # a new command starts with nothing received
    finally:
        signal.signal(signal.SIGINT, before)


# --------------------------------------------------------------------------------------
# training: divergence, resuming from a checkpoint that does not fit
# --------------------------------------------------------------------------------------


def _train(w: Path, out: Path, *extra: str) -> int:
    return main(["train", "--data", str(w / "data"), "--out", str(out), *TINY_TRAIN, *extra])


def test_an_update_that_overflows_is_a_divergence_naming_its_step(hostile, tmp_path, capsys):
    w = hostile[0]
    assert _train(w, tmp_path / "run", "--case", "sgd", "--lr", "1e308", "--max-iters", "5") == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "the update of step 1 overflows" in err, err
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["status"] == "diverged" and run["diverged_step"] == 1
    assert not (tmp_path / "run" / "ckpt.pt").exists()  # no good checkpoint of this run to keep


def test_a_diverged_run_keeps_its_last_good_checkpoint(hostile, tmp_path, capsys):
    w, out = hostile[0], tmp_path / "run"
    args = ["--case", "sgd", "--lr", "1e30", "--max-iters", "20", "--log-every", "4", "--ckpt-every", "1"]
    assert _train(w, out, *args, "--warmup-iters", "4") == 0
    err = capsys.readouterr().err
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "diverged" and f"at step {run['diverged_step']}" in err, err
    kept = torch.load(out / "ckpt.pt", weights_only=True)
    assert kept["iter_num"] < run["diverged_step"] and kept["attnid"]["summary"]["status"] == "diverged"
    assert all(torch.isfinite(tensor).all() for tensor in kept["model"].values())
    assert main(["inspect", str(out / "ckpt.pt"), "--csv"]) == 0  # a usable model


def test_resuming_from_a_checkpoint_that_does_not_fit_says_what(hostile, tmp_path, capsys):
    w, out = hostile[0], tmp_path / "run"
    assert _train(w, out, "--max-iters", "6", "--stop-after", "2") != 0  # stopped: a checkpoint to resume
    saved = torch.load(out / "ckpt.pt", weights_only=True)
    for change, expected in (
        (lambda c: c.pop("optimizer"), "lacks optimizer"),
        (lambda c: c["attnid"].pop("torch_rng"), "lacks attnid.torch_rng"),
        (
            lambda c: c["model"].update({"transformer.wte.weight": torch.zeros(3, 8)}),
            "transformer.wte.weight has shape (3, 8), expected",
        ),
    ):
        broken = {**saved, "attnid": dict(saved["attnid"]), "model": dict(saved["model"])}
        change(broken)
        torch.save(broken, out / "ckpt.pt")
        capsys.readouterr()
        assert _train(w, out, "--max-iters", "6") == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and expected in err and "--fresh" in err, err
        assert torch.load(out / "ckpt.pt", weights_only=True).keys() == broken.keys()  # left as it was


def test_train_options_carry_their_limits_as_metadata():
    """The workflow's schema is generated from TrainConfig's metadata: the new limits are there."""
    from dataclasses import fields

    from attnid.training.config import TrainConfig

    meta = {f.name: f.metadata for f in fields(TrainConfig)}
    for name in ("seed", "eval_iters", "threads", "metrics_threads"):
        assert isinstance(meta[name]["maximum"], int) and meta[name]["maximum"] >= 1, name
    assert meta["seed"]["maximum"] < 2**64 and meta["seed"]["bound"] == "non_negative"
    assert meta["min_lr"]["bound"] == "non_negative" and meta["diverge_threshold"]["bound"] == "positive"


def test_what_a_killed_edit_left_is_taken_over_by_the_next(tmp_path, capsys):
    """A SIGKILLed edit of a Hugging Face folder leaves its lock (with a dead pid) and a staging folder in
    --out: the next edit takes the lock over, removes the staging folder, and writes the folder."""
    _gpt2_folder(tmp_path / "hf")
    out = tmp_path / "out"
    (out / ".attnid-staging-killed").mkdir(parents=True)
    (out / ".attnid-staging-killed" / "model.safetensors").write_bytes(b"half a file")
    (out / ".attnid.lock").write_text("999999999\n")
    assert (
        main(["balance", str(tmp_path / "hf"), "--out", str(out), "--sequences", "1", "--length", "4"]) == 0
    )
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"], capsys.readouterr().err
