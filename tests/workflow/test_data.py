"""attnid fetch / prepare and the validating loaders (issue #3, data part)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import pickle
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import yaml
from pipeline_helpers import copy_pipeline, snakemake_env

from attnid.cli import main
from attnid.common.errors import UserError
from attnid.training import data

SHAKESPEARE_SHA256 = data.SHAKESPEARE_SHA256


@pytest.fixture
def http_server(tmp_path):
    """A local HTTP server over tmp_path/www, so http:// downloads are tested without a network."""
    root = tmp_path / "www"
    root.mkdir()

    class QuietHandler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_fetch_file_url_verifies_and_writes(shakespeare_url, tmp_path):
    out = tmp_path / "sub" / "input.txt"
    assert main(["fetch", "--url", shakespeare_url, "--sha256", SHAKESPEARE_SHA256, "--out", str(out)]) == 0
    assert out.stat().st_size == data.SHAKESPEARE_BYTES
    assert hashlib.sha256(out.read_bytes()).hexdigest() == SHAKESPEARE_SHA256
    assert _leftovers(out.parent) == ["input.txt"]  # no temporary file left behind


def test_fetch_http_streams_and_verifies(http_server, shakespeare_path, tmp_path):
    root, base = http_server
    (root / "input.txt").write_bytes(shakespeare_path.read_bytes())
    out = tmp_path / "got.txt"
    data.fetch(f"{base}/input.txt", SHAKESPEARE_SHA256, out, timeout=10)
    assert data.sha256_of_file(out) == SHAKESPEARE_SHA256


def test_fetch_rejects_truncated_and_corrupted_download(http_server, shakespeare_path, tmp_path):
    root, base = http_server
    content = shakespeare_path.read_bytes()
    (root / "truncated.txt").write_bytes(content[: len(content) // 2])
    corrupted = bytearray(content)
    corrupted[1000] ^= 0x01
    (root / "corrupted.txt").write_bytes(bytes(corrupted))
    out_dir = tmp_path / "out"
    for name in ("truncated.txt", "corrupted.txt"):
        with pytest.raises(UserError, match="checksum mismatch") as err:
            data.fetch(f"{base}/{name}", SHAKESPEARE_SHA256, out_dir / "input.txt")
        assert "\n" not in str(err.value) and "file://" in str(err.value)
    assert _leftovers(out_dir) == []  # never a half file, not even a temporary one


def test_fetch_replaces_a_bad_existing_file_only_when_the_new_one_verifies(shakespeare_url, tmp_path):
    out = tmp_path / "input.txt"
    out.write_text("stale")
    with pytest.raises(UserError):
        data.fetch(shakespeare_url, "0" * 64, out)
    assert out.read_text() == "stale"
    data.fetch(shakespeare_url, SHAKESPEARE_SHA256, out)
    assert data.sha256_of_file(out) == SHAKESPEARE_SHA256


def test_repository_ships_tiny_shakespeare(repo_root):
    """The shipped copy is byte for byte the file the pipeline's config names by sha256."""
    shipped = repo_root / "assets" / "tinyshakespeare.txt"
    content = shipped.read_bytes()
    assert len(content) == data.SHAKESPEARE_BYTES
    assert hashlib.sha256(content).hexdigest() == SHAKESPEARE_SHA256
    config = yaml.safe_load((repo_root / "config" / "config.yaml").read_text())
    assert config["data_sha256"] == SHAKESPEARE_SHA256


def test_fetch_copies_a_relative_local_path(shakespeare_path, tmp_path, monkeypatch):
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "tinyshakespeare.txt").write_bytes(shakespeare_path.read_bytes())
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "fetch",
                "--url",
                "assets/tinyshakespeare.txt",
                "--sha256",
                SHAKESPEARE_SHA256,
                "--out",
                "data/input.txt",
            ]
        )
        == 0
    )
    assert data.sha256_of_file(tmp_path / "data" / "input.txt") == SHAKESPEARE_SHA256


def test_offline_pipeline_command_fetches_the_shipped_copy(repo_root, tmp_path):
    """The README's offline spelling, ``--config data_url=file://$PWD/assets/tinyshakespeare.txt``, in a
    bare copy."""
    workdir = copy_pipeline(tmp_path / "clone")
    (workdir / "assets").mkdir()
    shutil.copy2(repo_root / "assets" / "tinyshakespeare.txt", workdir / "assets")
    command = (
        "snakemake --cores 1 data/tinyshakespeare/input.txt --configfile config/smoke.yaml "
        "--config data_url=file://$PWD/assets/tinyshakespeare.txt"
    )
    proc = subprocess.run(
        ["bash", "-c", command], cwd=workdir, capture_output=True, text=True, timeout=600, env=snakemake_env()
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert data.sha256_of_file(workdir / "data" / "tinyshakespeare" / "input.txt") == SHAKESPEARE_SHA256


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/nothing-listens-here",
        "file:///no/such/file.txt",
        "ftp://example.org/x",
        "no/such/local.txt",
    ],
)
def test_unreachable_or_unsupported_url_is_one_line(url, tmp_path, capsys):
    out = tmp_path / "input.txt"
    status = main(
        ["fetch", "--url", url, "--sha256", SHAKESPEARE_SHA256, "--out", str(out), "--timeout", "5"]
    )
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("attnid fetch: error:") and "file://" in err
    assert _leftovers(tmp_path) == []


def test_bad_sha256_argument_is_one_line(shakespeare_url, tmp_path, capsys):
    assert main(["fetch", "--url", shakespeare_url, "--sha256", "xyz", "--out", str(tmp_path / "a")]) == 2
    assert "64 hex digits" in capsys.readouterr().err


def test_prepare_matches_nanogpt_counts_and_roundtrips(prepared_data_dir, shakespeare_path):
    meta = data.load_meta(prepared_data_dir)
    text = shakespeare_path.read_text(encoding="utf-8")
    assert meta["vocab_size"] == 65 == len(set(text))
    assert (meta["train_tokens"], meta["val_tokens"]) == (1_003_854, 111_540)
    assert meta["itos"] == sorted(meta["itos"]) and meta["stoi"][meta["itos"][17]] == 17
    assert meta["source_sha256"] == SHAKESPEARE_SHA256
    train, val = data.load_split(prepared_data_dir, "train"), data.load_split(prepared_data_dir, "val")
    assert train.dtype == np.uint16 and train.shape == (1_003_854,) and val.shape == (111_540,)
    assert data.decode(train, meta["itos"]) + data.decode(val, meta["itos"]) == text
    # nanoGPT's sample.py reads meta.pkl with exactly these keys
    with open(prepared_data_dir / "meta.pkl", "rb") as handle:
        nanogpt_meta = pickle.load(handle)
    assert set(nanogpt_meta) == {"vocab_size", "itos", "stoi"} and nanogpt_meta["itos"][0] == "\n"
    raw_json = json.loads((prepared_data_dir / "meta.json").read_text())
    assert set(raw_json) >= {"vocab_size", "itos", "stoi"}


def test_prepare_small_text_splits_ninety_ten(tmp_path):
    text = "abcabcabcz" * 3  # 30 chars -> 27 train, 3 val
    (tmp_path / "t.txt").write_text(text)
    meta = data.prepare(tmp_path / "t.txt", tmp_path / "d")
    assert meta["vocab_size"] == 4 and (meta["train_tokens"], meta["val_tokens"]) == (27, 3)
    assert data.load_split(tmp_path / "d", "val").tolist() == [
        data.build_vocabulary(text)[0][c] for c in text[27:]
    ]


def _copy_prepared(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in ("meta.json", "val.bin"):
        (dst / name).write_bytes((src / name).read_bytes())
    (dst / "train.bin").write_bytes((src / "train.bin").read_bytes()[:4000])  # placeholder, replaced per test
    return dst


def test_truncated_train_bin_is_detected_before_training(prepared_data_dir, tmp_path):
    broken = _copy_prepared(prepared_data_dir, tmp_path / "broken")  # train.bin cut to 2,000 tokens
    with pytest.raises(UserError, match="truncated") as err:
        data.load_split(broken, "train")
    assert "attnid prepare" in str(err.value) and "\n" not in str(err.value)
    data.load_split(broken, "val")  # the intact split still loads


def test_out_of_vocabulary_token_is_detected(prepared_data_dir, tmp_path):
    broken = _copy_prepared(prepared_data_dir, tmp_path / "broken")
    tokens = np.fromfile(prepared_data_dir / "train.bin", dtype=np.uint16)
    tokens[12345] = 65
    tokens.tofile(broken / "train.bin")
    with pytest.raises(UserError, match="token 65"):
        data.load_split(broken, "train")


def test_missing_or_damaged_files_say_rerun_prepare(prepared_data_dir, tmp_path):
    with pytest.raises(UserError, match="attnid prepare"):
        data.load_meta(tmp_path)
    broken = _copy_prepared(prepared_data_dir, tmp_path / "broken")
    (broken / "val.bin").unlink()
    with pytest.raises(UserError, match="attnid prepare"):
        data.load_split(broken, "val")
    (broken / "meta.json").write_text("{not json")
    with pytest.raises(UserError, match="attnid prepare"):
        data.load_meta(broken)
    with pytest.raises(UserError, match="unknown split"):
        data.load_split(prepared_data_dir, "test")


def test_prepare_cli_missing_text_is_one_line(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnid",
            "prepare",
            "--text",
            str(tmp_path / "nope.txt"),
            "--out-dir",
            str(tmp_path / "d"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "attnid fetch" in result.stderr
