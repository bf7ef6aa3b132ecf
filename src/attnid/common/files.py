"""Files in and out: atomic writes (a killed job never leaves a half file behind), and reading
what a user hands us without running code from it.

Every file the pipeline produces goes through :func:`atomic_path`: the content is
written to a temporary name in the same directory and renamed into place only
once complete (``os.replace`` is atomic on POSIX within one filesystem), so
Snakemake never sees a truncated output that it would trust. Before that, the
command's output rule (:mod:`attnid.common.outputs`) decides whether the path may be
written at all.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pickle
import tempfile
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnid.common import outputs
from attnid.common.errors import UserError

if TYPE_CHECKING:
    import pandas as pd


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, fmt: outputs.Format | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` on success.

    ``fmt`` is what is written (default: by suffix, :func:`attnid.common.outputs.format_for`),
    for the active output rule. On any exception (including KeyboardInterrupt) the
    temporary file is removed and ``path`` is left untouched; an OSError names ``path``,
    not the temporary file.
    """
    target = Path(path)
    outputs.guard(target, fmt)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        # mkstemp makes the file 0600; outputs get the usual umask-based mode (shared clusters)
        os.chmod(tmp, 0o666 & ~_current_umask())
        os.replace(tmp, target)
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        if isinstance(err, OSError) and err.filename in (None, str(tmp), tmp_name):
            raise OSError(err.errno, err.strerror or str(err), str(target)) from err
        raise


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike, text: str, fmt: outputs.Format | None = None) -> Path:
    with atomic_path(path, fmt) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_bytes_atomic(path: str | os.PathLike, data: bytes, fmt: outputs.Format | None = None) -> Path:
    with atomic_path(path, fmt) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_json_atomic(path: str | os.PathLike, obj: Any, fmt: outputs.Format | None = None) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n", fmt)


def write_csv_atomic(path: str | os.PathLike, frame: pd.DataFrame) -> Path:
    """Write a pandas DataFrame as CSV (no index), atomically."""
    with atomic_path(path, outputs.CSV) as tmp:
        frame.to_csv(tmp, index=False)
    return Path(path)


def torch_save_atomic(path: str | os.PathLike, obj: Any) -> Path:
    import torch

    with atomic_path(path, outputs.TORCH_ARCHIVE) as tmp:
        try:
            torch.save(obj, tmp)
        except RuntimeError as err:  # torch's zip writer reports a full disk as a RuntimeError
            if "PytorchStreamWriter" not in str(err):
                raise
            raise UserError(f"cannot write {path}: {str(err).splitlines()[0]} (is the disk full?)") from None
    return Path(path)


# Globals a checkpoint of tensors and plain containers names: torch's tensor rebuilders, OrderedDict, bytes
PLAIN_PICKLE_GLOBALS = ("torch.", "collections.OrderedDict", "_codecs.encode")


def pickled_callables(path: str | os.PathLike) -> list[str]:
    """The ``module.name`` of every global a raw pickle file names (its ``GLOBAL``/``STACK_GLOBAL``
    opcodes), read with :mod:`pickletools`, which only parses: nothing is called. A file of several
    pickles (torch's legacy format) is read to its end; a damaged one as far as it parses."""
    import pickletools

    names: list[str] = []
    strings: list[str] = []
    with contextlib.suppress(Exception), open(path, "rb") as handle:
        while handle.peek(1) if hasattr(handle, "peek") else False:
            for opcode, argument, _ in pickletools.genops(handle):
                if opcode.name in ("GLOBAL", "INST"):
                    names.append(str(argument).replace(" ", "."))
                elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                    names.append(f"{strings[-2]}.{strings[-1]}")
                elif isinstance(argument, str):
                    strings.append(argument)
    return names


def not_a_checkpoint(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot hold a checkpoint, judged from its first bytes; None when it may hold one.

    A ``torch.save`` file is a zip archive (``PK``) or, from torch < 1.6 and nanoGPT's
    oldest checkpoints, a pickle (protocol 2+ starts with byte 0x80).
    """
    path = Path(path)
    if not os.path.lexists(path):
        return "does not exist"
    if path.is_dir():
        return "is a directory, not a checkpoint file"
    if path.stat().st_size == 0:
        return "is empty (0 bytes)"
    if outputs.TORCH_ARCHIVE.recognises(path) or outputs.starts_with(b"\x80")(path):
        return None
    text = outputs.text_head(path)
    if text is None:
        return "is neither a torch.save archive nor a pickle: not a checkpoint"
    if text.lstrip()[:1] in ("{", "["):
        return "is a JSON file, not a checkpoint"
    return "is a text file, not a checkpoint"


def load_weights_only(path: str | os.PathLike) -> Any:  # whatever the file holds: tensors, dicts, ...
    """``torch.load(path, weights_only=True)`` on the CPU; anything it rejects is one UserError line
    that says what is wrong with the file (:func:`not_a_checkpoint`, truncated or corrupt, or code refused).

    The weights-only unpickler builds only tensors, numbers, strings and plain
    containers; a pickle that names any other callable (``os.system``, ``exec``, a
    class of ours) is refused before it is called.
    """
    import torch
    from torch.torch_version import TorchVersion

    reason = not_a_checkpoint(path)
    if reason is not None:
        raise UserError(f"cannot read checkpoint {path}: {reason}")
    kind = "torch.save archive" if outputs.TORCH_ARCHIVE.recognises(Path(path)) else "pickle"
    # TorchVersion: a str subclass (torch.__version__) that attnid train's checkpoints record
    allow = getattr(torch.serialization, "safe_globals", None)  # torch >= 2.5
    try:
        with allow([TorchVersion]) if allow else contextlib.nullcontext(), warnings.catch_warnings():
            # a raw pickle (not torch's zip format) makes torch warn about its protocol before refusing it
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        code = next((line for line in lines if "GLOBAL" in line or "Unsupported global" in line), None)
        if code is None and kind == "pickle":  # torch's reader may stop at an opcode before it sees a global
            callables = [
                name for name in pickled_callables(path) if not name.startswith(PLAIN_PICKLE_GLOBALS)
            ]
            code = f"it names {callables[0]}, which unpickling would call" if callables else None
        if code is None:
            last = lines[-1] if lines else ""
            reason = next((line for line in lines if line.startswith("Unsupported")), last)
            raise UserError(
                f"cannot read checkpoint {path}: a pickle the weights-only loader cannot read "
                f"({reason}): truncated, corrupt or not a checkpoint"
            ) from None
        raise UserError(
            f"cannot read checkpoint {path}: refused by the weights-only loader ({code}); only "
            f"tensors and plain containers are accepted, because other pickled objects can run "
            f"code"
        ) from None
    except Exception as err:  # noqa: BLE001 - any other failure is a damaged file
        # torch's zip reader appends paragraphs of advice to its first sentence
        first = str(err).strip().splitlines()[0].split(". ")[0] if str(err).strip() else "it ends early"
        raise UserError(f"cannot read checkpoint {path}: a truncated or corrupt {kind} ({first})") from None


def read_yaml(path: str | os.PathLike, what: str) -> Any:
    """The YAML document in ``path`` (``what`` names it in errors: "config file"); every problem is one
    UserError line naming the file, and for a syntax error its line and column."""
    import yaml

    path = Path(path)
    if path.is_dir():
        raise UserError(f"{what} {path} is a directory; pass a YAML file")
    if not path.is_file():
        raise UserError(f"{what} {path} does not exist")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"{what} {path} is not UTF-8 text (a binary file?)") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(f"{what} {path} is not valid YAML{where}: {problem}") from None


def require(module: str, purpose: str) -> types.ModuleType:
    """Import an optional dependency (the ``hf`` extra), or say in one line how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(
            f"{purpose} needs the Python package {module.split('.')[0]!r}: pip install 'attnid[hf]'"
        ) from None
