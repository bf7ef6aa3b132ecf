"""One writer per output: a lock held for the life of the command (docs/design.md §6.1).

Every output a command declares (:mod:`attnid.common.outputs`) is locked with ``fcntl.flock`` on a
small lock file: ``.attnid.lock`` inside an output folder (a run directory, an edited Hugging Face
folder), ``.<name>.attnid.lock`` beside an output file. A second command that asks for the same
output finds it locked and stops with one line naming the holder's process id, which the holder
wrote into the lock file.

The kernel drops a ``flock`` when its process ends, however it ends, so the lock of a killed
command is stale by construction: the next command takes it over and writes its own id. The holder
deletes the lock file when it is done; a command that opened the old file just before that checks,
once it holds the lock, that the file it locked is still the one at the path, and starts over if
not, so two commands never hold "the" lock at once. Lock files live on the output's own
filesystem, so two machines writing one shared folder (NFS, a SLURM cluster) see each other's locks
where the filesystem supports ``flock``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

from attnid.common.errors import UserError

FOLDER_LOCK_NAME = ".attnid.lock"
ATTEMPTS = 5  # a lock file replaced under us this often in a row: someone is deleting it on purpose


def lock_path_for(output: Path, folder: bool) -> Path:
    """Where the lock of ``output`` lives: inside it for a folder, beside it for a file."""
    return output / FOLDER_LOCK_NAME if folder else output.with_name(f".{output.name}.attnid.lock")


def holder_of(lock_path: Path) -> str:
    """The process id written in ``lock_path``, as text ("unknown" while the holder is writing it)."""
    try:
        text = lock_path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


class OutputLock:
    """An exclusive lock on one output, taken by :meth:`acquire` and given back by :meth:`release`."""

    def __init__(self, output: Path, folder: bool, name: str):
        self.output, self.folder, self.name = output, folder, name
        self.path = lock_path_for(output, folder)
        self.created: list[Path] = []  # folders made to hold the lock file, removed again if left empty
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise a UserError naming the holder; creates the folder the lock file needs."""
        self._make_folder(self.path.parent)
        for _ in range(ATTEMPTS):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                os.close(fd)
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                self._remove_folders()
                raise UserError(
                    f"{self.name} is being written by another attnid command (pid {holder_of(self.path)}, "
                    f"lock {self.path}): wait for it to finish, or write somewhere else"
                ) from None
            if self._still_at_path(fd):
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode("ascii"))
                self.fd = fd
                return
            os.close(fd)  # its holder deleted it after we opened it: lock the file now at the path
        raise UserError(f"{self.name}: its lock file {self.path} keeps being replaced; try again")

    def _still_at_path(self, fd: int) -> bool:
        try:
            at_path = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (at_path.st_dev, at_path.st_ino) == (held.st_dev, held.st_ino)

    def _make_folder(self, folder: Path) -> None:
        missing = []
        while not os.path.lexists(folder):
            missing.append(folder)
            folder = folder.parent
        for item in reversed(missing):
            with contextlib.suppress(FileExistsError):
                item.mkdir()
                self.created.append(item)

    def _remove_folders(self) -> None:
        for folder in reversed(self.created):
            with contextlib.suppress(OSError):  # not empty: the command wrote something there
                folder.rmdir()
        self.created = []

    def release(self) -> None:
        """Delete the lock file, then unlock (see the module docstring for the order)."""
        if self.fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(self.fd)
        self.fd = None
        self._remove_folders()
