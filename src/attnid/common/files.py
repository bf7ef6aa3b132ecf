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
import pickletools
import tempfile
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from attnid.common import outputs
from attnid.common.errors import UserError
from attnid.common.paths import require_regular_file, special_kind

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
    fd, tmp_name = tempfile.mkstemp(
        prefix=outputs.temporary_prefix(target), suffix=outputs.TEMPORARY_SUFFIX, dir=target.parent
    )
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        # mkstemp makes the file 0600; outputs get the usual umask-based mode (shared clusters)
        os.chmod(tmp, 0o666 & ~_current_umask())
        os.replace(tmp, target)
        outputs.written(target)
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
    """``torch.save`` atomically. torch writes through a file object of ours, so that a failing write (a full
    disk, a file-size limit) surfaces as the OSError behind torch's own error: one line naming ``path``."""
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    import torch

    with atomic_path(path, outputs.TORCH_ARCHIVE) as tmp:
        try:
            with open(tmp, "wb") as handle:
                torch.save(obj, handle)
        except RuntimeError as err:  # torch's zip writer wraps the failed write
            cause = _os_error_behind(err)
            if cause is not None:
                raise OSError(cause.errno, cause.strerror or str(cause), str(path)) from err
            if not any(mark in str(err) for mark in TORCH_WRITE_FAILURES):
                raise
            raise UserError(f"cannot write {path}: {str(err).splitlines()[0]} (is the disk full?)") from None
    return Path(path)


# What torch's zip writer says when a write failed and it saw no OSError
TORCH_WRITE_FAILURES = ("PytorchStreamWriter", "unexpected pos", "iostream error")


def _os_error_behind(err: BaseException) -> OSError | None:
    """The OSError that caused ``err`` (its ``__cause__``/``__context__`` chain), if any."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError) and current.errno is not None:
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


# Globals a checkpoint of tensors and plain containers names: torch's tensor rebuilders, OrderedDict, bytes
PLAIN_PICKLE_GLOBALS = ("torch.", "collections.OrderedDict", "_codecs.encode")


def pickled_callables(path: str | os.PathLike) -> list[str]:
    """The ``module.name`` of every global a raw pickle file names (its ``GLOBAL``/``STACK_GLOBAL``
    opcodes), read with :mod:`pickletools`, which only parses: nothing is called. A file of several
    pickles (torch's legacy format) is read to its end; a damaged one as far as it parses."""
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
    kind = special_kind(path)
    if kind is not None:
        return f"is {kind}, not a regular file"
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
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
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


JSON_MAX_BYTES = 64 << 20  # a model's config.json or weight index: kilobytes; a report: less


def read_json(path: str | os.PathLike, what: str) -> Any:
    """The JSON value in ``path`` (``what`` names it: "weight index"); a special file, one over
    :data:`JSON_MAX_BYTES`, text that is not JSON, and JSON nested too deeply for Python's parser are
    each one UserError line naming the file."""
    path = Path(path)
    require_regular_file(path, what)
    if not path.is_file():
        raise UserError(f"{what} {path} does not exist")
    if path.stat().st_size > JSON_MAX_BYTES:
        raise UserError(f"{what} {path} has {path.stat().st_size:,} bytes, more than {JSON_MAX_BYTES:,}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{what} {path} is not valid JSON: {err}") from None
    except RecursionError:
        raise UserError(f"{what} {path} is JSON nested too deeply to be read") from None


# A YAML file attnid reads is a config of tens of keys: far below these. Aliases are followed when the
# nodes are counted, so a "billion laughs" of nested aliases is refused before anything expands it.
YAML_MAX_BYTES = 1 << 20
YAML_MAX_NODES = 10_000


def read_yaml(path: str | os.PathLike, what: str) -> Any:
    """The YAML document in ``path`` (``what`` names it in errors: "config file"); every problem is one
    UserError line naming the file, and for a syntax error its line and column. A file over
    :data:`YAML_MAX_BYTES`, or a document of more than :data:`YAML_MAX_NODES` values once its aliases are
    expanded, is refused."""
    path = Path(path)
    require_regular_file(path, what)
    if path.is_dir():
        raise UserError(f"{what} {path} is a directory; pass a YAML file")
    if not path.is_file():
        raise UserError(f"{what} {path} does not exist")
    if path.stat().st_size > YAML_MAX_BYTES:
        raise UserError(
            f"{what} {path} has {path.stat().st_size:,} bytes, more than the {YAML_MAX_BYTES:,} a "
            f"config may have"
        )
    try:
        text = path.read_text(encoding="utf-8")
        nodes = _expanded_nodes(yaml.compose(text, Loader=yaml.SafeLoader))
        if nodes > YAML_MAX_NODES:
            raise UserError(
                f"{what} {path} expands to more than {YAML_MAX_NODES:,} values with its aliases "
                f"followed, more than a config may have (an alias bomb?)"
            )
        return yaml.safe_load(text)
    except UnicodeDecodeError:
        raise UserError(f"{what} {path} is not UTF-8 text (a binary file?)") from None
    except RecursionError:
        raise UserError(f"{what} {path} is nested too deeply to be a config") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(f"{what} {path} is not valid YAML{where}: {problem}") from None


def _expanded_nodes(root: Any) -> int:
    """Values in a composed YAML document with every alias expanded: each node counted once per path that
    reaches it, computed once per node (an alias is the same node object as its anchor)."""
    if root is None:
        return 0
    counted: dict[int, int] = {}
    # depth first without recursion: (node, children counted?)
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, ready = stack.pop()
        if id(node) in counted:
            continue
        children = _children(node)
        if ready:
            counted[id(node)] = min(1 + sum(counted[id(child)] for child in children), YAML_MAX_NODES + 1)
            continue
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in counted)
    return counted[id(root)]


def _children(node: Any) -> list:
    value = node.value
    if not isinstance(value, list):  # a scalar
        return []
    return [part for item in value for part in (item if isinstance(item, tuple) else (item,))]


def require(module: str, purpose: str) -> types.ModuleType:
    """Import an optional dependency (the ``hf`` extra), or say in one line how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(
            f"{purpose} needs the Python package {module.split('.')[0]!r}: pip install 'attnid[hf]'"
        ) from None
