"""Atomic output writing: a killed job never leaves a half file behind.

Every file the pipeline produces goes through :func:`atomic_path`: the content is
written to a temporary name in the same directory and renamed into place only
once complete (``os.replace`` is atomic on POSIX within one filesystem), so
Snakemake never sees a truncated output that it would trust.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` on success.

    On any exception (including KeyboardInterrupt) the temporary file is removed
    and ``path`` is left untouched.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        # mkstemp makes the file 0600; outputs get the usual umask-based mode (shared clusters)
        os.chmod(tmp, 0o666 & ~_current_umask())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def write_csv_atomic(path: str | os.PathLike, frame) -> Path:
    """Write a pandas DataFrame as CSV (no index), atomically."""
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)
    return Path(path)


def torch_save_atomic(path: str | os.PathLike, obj: Any) -> Path:
    import torch

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)
    return Path(path)
