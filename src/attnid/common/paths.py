"""Which paths attnid opens: regular files only, and a folder's entries only inside that folder
(docs/design.md §6.1).

- :func:`special_kind` says what a path is when it is not a regular file or a folder: a FIFO, a
  device, a socket or a symlink loop. Opening a FIFO blocks until a writer comes, a device reads
  forever (``/dev/zero``) or is replaced by ``--force``; all of them are refused by name before
  anything opens them, as inputs (:func:`require_regular_file`) and as outputs
  (:mod:`attnid.common.outputs`).
- :func:`inside` resolves an entry that a folder names (a shard listed in a weight index, a file
  found in the folder) and refuses an absolute name, a ``..`` part, or a symlink that resolves out
  of the folder, so a folder from elsewhere cannot make a command read, copy or write a file that
  is not its own.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePosixPath

from attnid.common.errors import UserError

# st_mode test -> what a user calls it
SPECIAL_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
# A Hugging Face hub cache links a snapshot's files to the repository's blobs: models--O--N/snapshots/REV/x ->
# ../../blobs/HASH. The repository folder, not the snapshot, is then what the entries must stay inside.
HUB_SNAPSHOTS, HUB_REPO_PREFIX = "snapshots", "models--"


def special_kind(path: str | os.PathLike) -> str | None:
    """What ``path`` is when it exists and is neither a regular file nor a folder (symlinks followed):
    "a FIFO (named pipe)", "a character device", "a block device", "a socket", "a symlink loop"; None
    for a regular file, a folder, or a path that does not exist (its reader says so)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "a symlink loop"
        return None
    return next((kind for test, kind in SPECIAL_KINDS if test(mode)), None)


def require_regular_file(path: str | os.PathLike, what: str) -> None:
    """Refuse (one UserError line) a ``path`` that is a FIFO, a device, a socket or a symlink loop, before
    anything opens it. ``what`` names it: "checkpoint", "--text"."""
    kind = special_kind(path)
    if kind is not None:
        raise UserError(f"{what} {path} is {kind}, not a regular file: attnid reads only regular files")


def containment_root(folder: str | os.PathLike) -> Path:
    """The resolved folder whose entries must stay inside it: ``folder`` itself, or for a snapshot of a
    Hugging Face hub cache (``models--*/snapshots/REV``) the repository folder that holds its blobs."""
    root = Path(folder).resolve()
    if root.parent.name == HUB_SNAPSHOTS and root.parent.parent.name.startswith(HUB_REPO_PREFIX):
        return root.parent.parent
    return root


def inside(folder: str | os.PathLike, name: object, what: str) -> Path:
    """``folder / name`` for an entry ``name`` that ``what`` (e.g. "the weight index x.json") names,
    after refusing, in one line naming the entry: a name that is not a non-empty relative path, a ``..``
    part, and a path that resolves (symlinks followed) outside :func:`containment_root` of ``folder``."""
    if not isinstance(name, str) or not name.strip() or "\0" in name:
        raise UserError(f"{what} names the entry {name!r}, which is not a file name")
    parts = PurePosixPath(name).parts
    if PurePosixPath(name).is_absolute() or os.path.isabs(name):
        raise UserError(
            f"{what} names the entry {name!r}, an absolute path: only files inside {folder} are read"
        )
    if ".." in parts:
        raise UserError(
            f"{what} names the entry {name!r}, which climbs out with '..': only files inside {folder} "
            f"are read"
        )
    path = Path(folder) / name
    root = containment_root(folder)
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):  # a symlink loop on the way
        raise UserError(f"{what} names the entry {name!r}, which is a symlink loop") from None
    if resolved != root and root not in resolved.parents:
        raise UserError(
            f"{what} names the entry {name!r}, a symlink to {resolved}, outside {folder}: only files "
            f"inside the folder are read (copy it with its links resolved, cp -rL, to use it)"
        )
    return path
