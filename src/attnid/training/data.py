"""Data: download tiny shakespeare, encode it at character level, load it back safely.

Two commands and two loaders:

- ``attnid fetch --url URL --sha256 HEX --out PATH`` streams an http(s) or ``file://``
  URL, or a local path (relative to the working directory), into a temporary file next
  to ``PATH``, checks its sha256 and only then renames it into place, so a wrong
  checksum or a dropped connection never leaves a file that Snakemake would trust.
  The repository ships tiny shakespeare as ``assets/tinyshakespeare.txt``, so
  ``--url assets/tinyshakespeare.txt`` works offline.
- ``attnid prepare --text PATH --out-dir DIR`` is nanoGPT's ``shakespeare_char``
  preparation: sorted character vocabulary, first 90 % of the text for training, last
  10 % for validation, uint16 ``train.bin`` / ``val.bin``, and the vocabulary in
  ``meta.json`` (and nanoGPT's ``meta.pkl``, so nanoGPT's ``sample.py`` reads it).
  Tiny shakespeare gives 65 symbols, 1,003,854 train and 111,540 val tokens.
- :func:`load_meta` and :func:`load_split` are what the trainer reads; they check the
  files against each other (missing file, truncated ``.bin``, token outside the
  vocabulary) and raise a one-line :class:`~attnid.common.errors.UserError` that says to rerun
  ``attnid prepare`` instead of letting training crash or, worse, train on garbage.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from attnid.common import outputs
from attnid.common.errors import UserError
from attnid.common.files import atomic_path, write_bytes_atomic, write_json_atomic
from attnid.common.paths import require_regular_file

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
SHAKESPEARE_BYTES = 1_115_394

TRAIN_FRACTION = 0.9  # nanoGPT: first 90 % train, last 10 % val
SPLITS = ("train", "val")
TOKEN_DTYPE = np.uint16  # nanoGPT's on-disk token type; caps the vocabulary at 65,536
VOCAB_LIMIT = int(np.iinfo(TOKEN_DTYPE).max) + 1
CHUNK_BYTES = 1 << 20
PROGRESS_MIN_BYTES = 8 << 20  # only large downloads print progress
META_NAME = "meta.json"
URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
# What meta.json holds while 'attnid prepare' writes the .bin files: load_meta refuses it, and it marks the
# folder as one that prepare writes (docs/design.md §6.1)
INCOMPLETE_META = {"attnid_prepare": "incomplete: rerun attnid prepare"}


def _is_prepare_meta(path) -> bool:
    meta = outputs.json_object(path)
    return meta is not None and ("source_sha256" in meta and "vocab_size" in meta or "attnid_prepare" in meta)


PREPARED_META = outputs.Format("the meta.json of attnid prepare", _is_prepare_meta)
PREPARED_FILE = outputs.Format(
    "a file of attnid prepare (in a folder whose meta.json attnid prepare wrote)",
    lambda path: _is_prepare_meta(path.parent / META_NAME),
)


# ---------------------------------------------------------------------------------------
# fetch


def sha256_of_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetched_format(sha256: str) -> outputs.Format:
    """What ``attnid fetch`` writes: the file with this sha256 (anything else at ``--out`` is foreign)."""
    return outputs.Format(
        f"the file with sha256 {sha256}", lambda path: path.is_file() and sha256_of_file(path) == sha256
    )


def check_sha256_argument(sha256: str) -> str:
    sha256 = sha256.strip().lower()
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise UserError(f"--sha256 must be 64 hex digits, got {sha256!r}")
    return sha256


def source_url(source: str) -> str:
    """``source`` as a URL that urllib opens: http(s):// and file:// URLs unchanged, a local path
    (absolute, or relative to the working directory) as a ``file://`` URL.

    A one-letter "scheme" is a Windows drive (``C:\\data\\input.txt``), so it counts as a path.
    """
    match = URL_SCHEME.match(source)
    if match and len(match.group(1)) > 1:
        scheme = match.group(1).lower()
        if scheme not in ("http", "https", "file"):
            raise UserError(
                f"unsupported URL {source!r}: use http(s)://, file:///absolute/path or a local path"
            )
        return source
    path = Path(source).expanduser()
    if not path.is_file():
        raise UserError(
            f"{source} is not a file (looked in {path.resolve()}): pass an existing local path, "
            f"a file:///absolute/path or an http(s):// URL"
        )
    return path.resolve().as_uri()


def local_source(source: str) -> Path | None:
    """The local file that ``source`` (a path or a file:// URL) names; None for http(s) or a bad URL."""
    match = URL_SCHEME.match(source)
    if match and len(match.group(1)) > 1:
        if match.group(1).lower() != "file":
            return None
        return Path(urllib.request.url2pathname(urllib.parse.urlparse(source).path))
    return Path(source).expanduser()


def fetch(
    url: str, sha256: str, out: str | os.PathLike, timeout: float = 60.0, progress: bool = True
) -> Path:
    """Download ``url`` (or copy a local path) to ``out`` if and only if its content has the given sha256.

    Streams in chunks into a temporary file in ``out``'s directory (never holding the
    file in memory); the rename onto ``out`` happens only after the checksum matched.
    An ``out`` that already has the right checksum is kept and not downloaded again.
    """
    sha256 = check_sha256_argument(sha256)
    out = Path(out)
    local = local_source(url)
    if local is not None:  # a FIFO would block the copy, a device never end it
        require_regular_file(local, "--url")
    if out.is_file() and sha256_of_file(out) == sha256:
        return out
    url = source_url(url)
    digest = hashlib.sha256()
    received = 0
    started = time.monotonic()
    with atomic_path(out, fetched_format(sha256)) as tmp:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response, open(tmp, "wb") as sink:
                total = int(response.headers.get("Content-Length") or 0)
                show_progress = progress and total >= PROGRESS_MIN_BYTES
                while chunk := response.read(CHUNK_BYTES):
                    sink.write(chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    if show_progress:
                        rate = received / max(time.monotonic() - started, 1e-9) / 1e6
                        print(
                            f"\rfetch: {received / 1e6:.1f}/{total / 1e6:.1f} MB ({rate:.1f} MB/s)",
                            end="",
                            file=sys.stderr,
                            flush=True,
                        )
                if show_progress:
                    print(file=sys.stderr)
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", None) or err
            raise UserError(
                f"could not download {url}: {reason}; check the URL or network, or download the file "
                f"yourself and pass --url file:///absolute/path/to/it"
            ) from None
        if digest.hexdigest() != sha256:
            raise UserError(
                f"checksum mismatch for {url}: got sha256 {digest.hexdigest()} ({received:,} bytes), "
                f"expected {sha256}; the download is corrupt or truncated, or the URL points at a "
                f"different file: nothing was written to {out}; retry, or pass a file:// URL to a good copy"
            )
    return out


# ---------------------------------------------------------------------------------------
# prepare


def build_vocabulary(text: str) -> tuple[dict[str, int], list[str]]:
    """nanoGPT's character vocabulary: every distinct character, sorted by code point."""
    itos = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(itos)}
    return stoi, itos


def encode(text: str, stoi: dict[str, int]) -> np.ndarray:
    """Characters -> token ids, shape (len(text),), uint16."""
    return np.array([stoi[ch] for ch in text], dtype=TOKEN_DTYPE)


def decode(tokens: Iterable[int], itos: list[str]) -> str:
    return "".join(itos[int(t)] for t in tokens)


def prepare(text_path: str | os.PathLike, out_dir: str | os.PathLike) -> dict:
    """Write ``train.bin``, ``val.bin``, ``meta.json`` and ``meta.pkl`` for ``text_path`` into ``out_dir``.

    ``meta.json`` is written last, so its presence means both ``.bin`` files are complete.
    Returns the metadata dictionary.
    """
    text_path, out_dir = Path(text_path), Path(out_dir)
    require_regular_file(text_path, "--text")
    if text_path.is_dir():
        raise UserError(f"--text {text_path} is a directory; pass the text file to encode")
    if not text_path.is_file():
        raise UserError(f"text file {text_path} not found: run 'attnid fetch' first or pass the right --text")
    raw = text_path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{text_path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    if len(text) < 2:
        raise UserError(
            f"{text_path} has {len(text)} characters: need at least 2 to split into train and val"
        )
    stoi, itos = build_vocabulary(text)
    if len(itos) > np.iinfo(TOKEN_DTYPE).max + 1:
        raise UserError(
            f"{text_path} has {len(itos):,} distinct characters; uint16 tokens allow at most 65,536"
        )
    n_train = int(len(text) * TRAIN_FRACTION)
    splits = {"train": encode(text[:n_train], stoi), "val": encode(text[n_train:], stoi)}
    meta = {
        "vocab_size": len(itos),
        "itos": {i: ch for i, ch in enumerate(itos)},  # nanoGPT's keys; JSON turns the int keys into strings
        "stoi": stoi,
        "train_tokens": int(splits["train"].size),
        "val_tokens": int(splits["val"].size),
        "dtype": np.dtype(TOKEN_DTYPE).name,
        "source": text_path.name,
        "source_sha256": hashlib.sha256(raw).hexdigest(),
        "source_bytes": len(raw),
    }
    # A stale meta.json next to fresh .bin files would pass validation with wrong counts: until the .bin
    # files are complete, meta.json says that they are not.
    write_json_atomic(out_dir / META_NAME, INCOMPLETE_META, PREPARED_META)
    for split, tokens in splits.items():
        write_bytes_atomic(out_dir / f"{split}.bin", tokens.tobytes(), PREPARED_FILE)
    nanogpt_meta = {"vocab_size": len(itos), "itos": dict(enumerate(itos)), "stoi": stoi}
    write_bytes_atomic(out_dir / "meta.pkl", pickle.dumps(nanogpt_meta), PREPARED_FILE)
    write_json_atomic(out_dir / META_NAME, meta, PREPARED_META)
    return meta


# ---------------------------------------------------------------------------------------
# loading, with validation


def _rerun_hint(data_dir: Path) -> str:
    return f"rerun 'attnid prepare --text <tinyshakespeare.txt> --out-dir {data_dir}'"


def load_meta(data_dir: str | os.PathLike) -> dict:
    """Read ``meta.json``: ``vocab_size``, ``itos`` (list, index -> char), ``stoi``, token counts,
    source sha256."""
    data_dir = Path(data_dir)
    path = data_dir / META_NAME
    require_regular_file(path, "data file")
    if not path.is_file():
        raise UserError(f"{path} not found: {_rerun_hint(data_dir)}")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(meta, dict) and "attnid_prepare" in meta:
            raise UserError(
                f"{path} says the data is incomplete (attnid prepare was interrupted): "
                f"{_rerun_hint(data_dir)}"
            )
        for key, largest in (("vocab_size", VOCAB_LIMIT), ("train_tokens", None), ("val_tokens", None)):
            value = meta[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{key} is {value!r}, not a count")
            if largest is not None and not 1 <= value <= largest:
                raise ValueError(f"{key} is {value}, outside 1..{largest} (uint16 tokens)")
        itos = [meta["itos"][str(i)] for i in range(meta["vocab_size"])]
        for key in ("stoi", "source_sha256"):
            meta[key]  # noqa: B018 - presence check
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError, RecursionError) as err:
        raise UserError(
            f"{path} is damaged or from another tool ({type(err).__name__}: {err}): {_rerun_hint(data_dir)}"
        ) from None
    meta["itos"] = itos
    return meta


def load_split(data_dir: str | os.PathLike, split: str, check_tokens: bool = True) -> np.memmap:
    """Memory-map ``<split>.bin`` as uint16, shape (n_tokens,), after checking it against ``meta.json``.

    Catches a missing file, a size that disagrees with the recorded token count (e.g. a
    truncated ``train.bin``) and, when ``check_tokens``, any token id >= ``vocab_size``
    (one pass over the file: ~1 ms per million tokens).
    """
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}: choose one of {', '.join(SPLITS)}")
    data_dir = Path(data_dir)
    meta = load_meta(data_dir)
    path = data_dir / f"{split}.bin"
    require_regular_file(path, "data file")
    if not path.is_file():
        raise UserError(f"{path} not found: {_rerun_hint(data_dir)}")
    expected = int(meta[f"{split}_tokens"])
    itemsize = np.dtype(TOKEN_DTYPE).itemsize
    size = path.stat().st_size
    if size != expected * itemsize:
        raise UserError(
            f"{path} has {size:,} bytes but meta.json records {expected:,} tokens "
            f"({expected * itemsize:,} bytes): the file is truncated or stale; {_rerun_hint(data_dir)}"
        )
    if expected == 0:
        raise UserError(f"{path} holds no tokens: {_rerun_hint(data_dir)}")
    tokens = np.memmap(path, dtype=TOKEN_DTYPE, mode="r")
    if check_tokens:
        largest = int(tokens.max())
        if largest >= int(meta["vocab_size"]):
            raise UserError(
                f"{path} contains token {largest} but the vocabulary has {meta['vocab_size']} symbols: "
                f"the file is corrupt; {_rerun_hint(data_dir)}"
            )
    return tokens
