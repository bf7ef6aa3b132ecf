"""Files in and out: atomic writes (a killed job never leaves a half file behind), and reading
what a user hands us without running code from it.

Every file the pipeline produces goes through :func:`atomic_path`: the content is
written to a temporary name in the same directory and renamed into place only
once complete (``os.replace`` is atomic on POSIX within one filesystem), so
Snakemake never sees a truncated output that it would trust.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pickle
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator

from attnid.common.errors import UserError


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


def load_weights_only(path: str | os.PathLike):
    """``torch.load(path, weights_only=True)`` on the CPU; anything it rejects is one UserError line.

    The weights-only unpickler builds only tensors, numbers, strings and plain
    containers; a pickle that names any other callable (``os.system``, ``exec``, a
    class of ours) is refused before it is called.
    """
    import torch
    from torch.torch_version import TorchVersion

    # TorchVersion: a str subclass (torch.__version__) that attnid train's checkpoints record
    allow = getattr(torch.serialization, "safe_globals", None)  # torch >= 2.5
    try:
        with allow([TorchVersion]) if allow else contextlib.nullcontext(), warnings.catch_warnings():
            # a raw pickle (not torch's zip format) makes torch warn about its protocol before refusing it
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        lines = str(err).splitlines()
        reason = next((ln.strip() for ln in lines if "GLOBAL" in ln or "Unsupported" in ln), lines[0] if lines else "")
        raise UserError(f"cannot read checkpoint {path}: refused by the weights-only loader ({reason}); only tensors "
                        f"and plain containers are accepted, because other pickled objects can run code") from None
    except Exception as err:  # noqa: BLE001 - any other failure is a damaged or foreign file
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise UserError(f"cannot read checkpoint {path}: {type(err).__name__}: {first}") from None


def require(module: str, purpose: str):
    """Import an optional dependency (the ``hf`` extra), or say in one line how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(f"{purpose} needs the Python package {module.split('.')[0]!r}: "
                        f"pip install 'attnid[hf]'") from None
