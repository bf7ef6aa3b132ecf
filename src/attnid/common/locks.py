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

A build holds one more such lock, :class:`BuildLock`, on its whole ``results_dir``
(``.attnid-build.lock`` in it) from before Snakemake reads its records to the build's end, so that a
second build of the same folder stops in one line naming the first (docs/cluster.md). Its file holds
the holder's pid, the process's start time (against a pid the system has since given to another
process), its host and when it started; a lock whose holder is gone is taken over, and said so.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from attnid.common.errors import UserError

FOLDER_LOCK_NAME = ".attnid.lock"
BUILD_LOCK_NAME = ".attnid-build.lock"
ATTEMPTS = 5  # a lock file replaced under us this often in a row: someone is deleting it on purpose
HOLDER_WAIT_S = 2.0  # how long a refused build waits for the holder to write its record


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
                raise UserError(self.held_message()) from None
            if self._still_at_path(fd):
                self._take(fd)
                return
            os.close(fd)  # its holder deleted it after we opened it: lock the file now at the path
        raise UserError(f"{self.name}: its lock file {self.path} keeps being replaced; try again")

    def held_message(self) -> str:
        """The one line for a lock that another process holds."""
        return (
            f"{self.name} is being written by another attnid command (pid {holder_of(self.path)}, "
            f"lock {self.path}): wait for it to finish, or write somewhere else"
        )

    def record(self) -> str:
        """What the holder writes into its lock file: its process id."""
        return f"{os.getpid()}\n"

    def _take(self, fd: int) -> None:
        os.ftruncate(fd, 0)
        os.write(fd, self.record().encode("ascii"))
        self.fd = fd

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


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat from the third (the state) on; None where there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
        return stat.rsplit(")", 1)[1].split()  # after the command's name, which may hold spaces
    except (OSError, IndexError):
        return None


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (Linux's /proc); None where unknown."""
    fields = _proc_stat(pid)
    try:
        return int(fields[19]) if fields else None  # field 22
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class Holder:
    """Who holds a build lock: the record in its file."""

    pid: int
    ticks: int | None  # the process's start time (start_ticks): a reused pid has another
    host: str
    started: str  # when it took the lock, for people

    @classmethod
    def me(cls) -> Holder:
        return cls(
            os.getpid(), start_ticks(os.getpid()), socket.gethostname(), time.strftime("%Y-%m-%d %H:%M:%S %Z")
        )

    @classmethod
    def read(cls, lock_path: Path) -> Holder | None:
        """The record in ``lock_path``; None if there is none (yet) or it does not parse."""
        try:
            fields = json.loads(lock_path.read_text(encoding="utf-8"))
            return cls(int(fields["pid"]), fields["ticks"], str(fields["host"]), str(fields["started"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def running_here(self) -> bool:
        """Whether this holder is a process of this host that still runs (its pid with its start time)."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # another user's process: it runs
        fields = _proc_stat(self.pid)
        if fields and fields[0] == "Z":
            return False  # killed, not yet reaped by its parent
        ticks = start_ticks(self.pid)
        return self.ticks is None or ticks is None or ticks == self.ticks

    def names(self) -> str:
        where = "" if self.host == socket.gethostname() else f" on {self.host}"
        return f"pid {self.pid}{where}, started {self.started}"


class BuildLock(OutputLock):
    """The lock of one build on its ``results_dir``: ``with BuildLock(results_dir):`` around the build.

    A second build raises a UserError naming the first (:meth:`held_message`). A lock file left by a
    build that ended without releasing it (killed) is taken over, and :attr:`taken_over` says so in one
    line; so is one whose process id now names another process (its start time differs). A record that
    names a process of this host that still runs is never taken over, even where the filesystem lets
    ``flock`` through.
    """

    def __init__(self, results_dir: str | os.PathLike):
        super().__init__(Path(results_dir), folder=True, name=str(results_dir))
        self.path = self.output / BUILD_LOCK_NAME
        self.taken_over: str | None = None

    def held_message(self, holder: Holder | None = None) -> str:
        holder = holder or self._holder_now()
        who = holder.names() if holder else "pid unknown"
        pid = holder.pid if holder else "its pid"
        return (
            f"another build of {self.name} is running ({who}; lock {self.path}): wait for it to end, "
            f"or stop it (kill {pid}) and start this build again"
        )

    def _holder_now(self) -> Holder | None:
        """The holder's record, waiting a moment for one that has just taken the lock to write it."""
        deadline = time.monotonic() + HOLDER_WAIT_S
        while True:
            holder = Holder.read(self.path)
            if (holder and (holder.running_here() or holder.host != socket.gethostname())) or (
                time.monotonic() > deadline
            ):
                return holder
            time.sleep(0.02)

    def record(self) -> str:
        return json.dumps(asdict(Holder.me())) + "\n"

    def _take(self, fd: int) -> None:
        previous = Holder.read(self.path)
        if previous is not None and previous.running_here():
            os.close(fd)  # flock let us through, but the holder runs: a filesystem without flock
            self._remove_folders()
            raise UserError(self.held_message(previous))
        if previous is not None:
            gone = f"the build that held its lock ({previous.names()}) is gone"
            self.taken_over = f"{self.name}: {gone}; its lock is taken over"
        super()._take(fd)

    def __enter__(self) -> BuildLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
