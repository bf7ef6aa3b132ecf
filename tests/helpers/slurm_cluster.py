"""A real single-node SLURM cluster on localhost, for tests: munge, MariaDB, slurmdbd, slurmctld, slurmd.

Everything (configuration, state, sockets, logs, the MariaDB data directory) lives
under one directory; every daemon listens on 127.0.0.1 on a free port, runs in the
foreground as a child of this process, and is stopped by the PID it was started
with. No systemd, no cgroups (``proctrack/linuxproc``, ``task/none``), and four fake
GPUs (``Gres=gpu:fake:4`` backed by ``/dev/null``, ``/dev/zero``, ``/dev/full`` and ``/dev/random``: SLURM
drops a GPU without ``File=``), so four GPU jobs can run at once: like the CPUs (``min_cpus``), more than
the test machine has, because a short job spends most of its life starting up and waiting for polls.

Use it as a context manager::

    with SlurmCluster(tmp_path / "slurm") as cluster:
        subprocess.run(["sbatch", ...], env=cluster.env)

``cluster.env`` carries ``SLURM_CONF`` so every client (sbatch, sacct, squeue, the
Snakemake plugin, and jobs through ``--export=ALL``) talks to this cluster. On any
failure, :meth:`logs` returns the tail of every daemon log, so CI output says why.

Needs root and Debian's ``slurmctld slurmd slurm-client slurmdbd munge mariadb-server``
(``.ci/run`` installs them); :func:`missing_requirements` says what is missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PROGRAMS = (
    "munged",
    "mariadbd",
    "mariadb-install-db",
    "mariadb",
    "slurmdbd",
    "slurmctld",
    "slurmd",
    "sbatch",
    "srun",
    "sacct",
    "squeue",
    "sinfo",
    "sacctmgr",
    "scontrol",
)
PARTITION = "attnid"
FAKE_GPU_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random")  # character devices: one per GPU
CLUSTER_NAME = "attnidtest"
DB_NAME = "slurm_acct_db"
DB_USER, DB_PASSWORD = "slurm", "attnid-test-only"


def missing_requirements() -> list[str]:
    """What stops a cluster from starting here (empty list: nothing)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (slurmd and munged must run as root)")
    missing += [f"program {name}" for name in PROGRAMS if shutil.which(name) is None]
    return missing


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _node_hardware(min_cpus: int) -> str:
    """The node's memory as slurmd sees it, and at least ``min_cpus`` CPUs (one socket, one thread per
    core)."""
    output = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30).stdout
    fields = dict(item.split("=", 1) for item in output.split() if "=" in item)
    cpus = max(int(fields["CPUs"]), min_cpus)
    return (
        f"CPUs={cpus} Boards=1 SocketsPerBoard=1 CoresPerSocket={cpus} ThreadsPerCore=1 "
        f"RealMemory={fields['RealMemory']}"
    )


class ClusterError(RuntimeError):
    pass


class SlurmCluster:
    def __init__(self, root: str | os.PathLike, hostname: str | None = None, min_cpus: int = 6):
        self.root = Path(root).resolve()
        self.hostname = (
            hostname
            or subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=True).stdout.strip()
        )
        # More CPUs than the machine has: short jobs spend much of their life starting up and
        # waiting for status polls, so running more at once shortens the test (config_overrides).
        self.min_cpus = min_cpus
        self.processes: dict[str, subprocess.Popen] = {}
        self.ports = {name: free_port() for name in ("mariadb", "slurmdbd", "slurmctld", "slurmd")}
        self.conf = self.root / "etc" / "slurm.conf"
        # Unix socket paths are limited to 108 bytes, and slurmd names its step sockets
        # <spool>/<host>_<job>.<step> (e.g. vm_13.4294967291): under a deep pytest tmp_path
        # (pytest-of-root/pytest-137/popen-gw1/test_...) they do not fit and every job's
        # launch fails. The sockets and the spool live in a short directory of their own.
        self.sockets = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp" if os.path.isdir("/tmp") else None))
        self.munge_socket = self.sockets / "munge.socket"
        self.db_socket = self.sockets / "mysqld.sock"
        self.spool = self.sockets / "spool"
        # The Snakemake job step drops every SLURM_* variable (SLURM_CONF too) before its
        # nested `srun`; on a real cluster srun finds /etc/slurm/slurm.conf, here an srun
        # wrapper first on PATH points it back at this cluster's configuration.
        self.bin = self.root / "bin"
        self.env = dict(
            os.environ, SLURM_CONF=str(self.conf), PATH=f"{self.bin}{os.pathsep}{os.environ['PATH']}"
        )

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()
        shutil.rmtree(self.sockets, ignore_errors=True)

    def start(self, timeout: float = 120.0) -> None:
        missing = missing_requirements()
        if missing:
            raise ClusterError(
                "cannot start a SLURM test cluster, missing: "
                + ", ".join(missing)
                + " (run .ci/run as root: it installs Debian's slurm and mariadb packages)"
            )
        deadline = time.monotonic() + timeout
        self._write_configs()
        self._start_munge(deadline)
        self._start_mariadb(deadline)
        self._spawn("slurmdbd", ["slurmdbd", "-D"])  # reads slurmdbd.conf next to $SLURM_CONF
        self._wait(lambda: _port_open(self.ports["slurmdbd"]), "slurmdbd listening", deadline, "slurmdbd")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(
            lambda: self._ok(["scontrol", "ping"], "UP"),
            "slurmctld answering scontrol ping",
            deadline,
            "slurmctld",
        )
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.hostname])
        self._wait(self._node_idle, f"node {self.hostname} idle", deadline, "slurmd")
        # The cluster must be known to slurmdbd before sacct can list its jobs.
        self._wait(
            lambda: self._ok(["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"], CLUSTER_NAME),
            "cluster registered in slurmdbd",
            deadline,
            "slurmctld",
        )

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM every daemon we started (newest first) by its PID, SIGKILL what is left after ``grace``."""
        for process in reversed(list(self.processes.values())):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=grace)
        self.processes.clear()

    # -- configuration --------------------------------------------------------------------

    def _write_configs(self) -> None:
        for sub in ("bin", "etc", "log", "run", "munge", "mysql", "ctld-state"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.spool.mkdir(parents=True, exist_ok=True)
        srun = self.bin / "srun"
        srun.write_text(f'#!/bin/sh\nSLURM_CONF={self.conf} exec {shutil.which("srun")} "$@"\n')
        srun.chmod(0o755)
        hardware = _node_hardware(self.min_cpus)
        etc, log, run = self.root / "etc", self.root / "log", self.root / "run"
        (etc / "plugstack.conf").write_text("")
        (etc / "gres.conf").write_text(
            f"NodeName={self.hostname} Name=gpu Type=fake File={','.join(FAKE_GPU_FILES)}\n"
        )
        munge_auth = f"AuthInfo=socket={self.munge_socket}"
        self.conf.write_text(f"""\
ClusterName={CLUSTER_NAME}
SlurmctldHost={self.hostname}(127.0.0.1)
SlurmctldPort={self.ports["slurmctld"]}
SlurmdPort={self.ports["slurmd"]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
{munge_auth}
StateSaveLocation={self.root / "ctld-state"}
SlurmdSpoolDir={self.spool}
SlurmctldPidFile={run / "slurmctld.pid"}
SlurmdPidFile={run / "slurmd.pid"}
SlurmctldLogFile={log / "slurmctld.log"}
SlurmdLogFile={log / "slurmd.log"}
PlugStackConfig={etc / "plugstack.conf"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=600
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={self.ports["slurmdbd"]}
AccountingStorageTRES=gres/gpu
AccountingStoreFlags=job_comment
AccountingStoragePass={self.munge_socket}
MailProg=/bin/true
JobCompType=jobcomp/none
NodeName={self.hostname} NodeAddr=127.0.0.1 {hardware} Gres=gpu:fake:{len(FAKE_GPU_FILES)} State=UNKNOWN
PartitionName={PARTITION} Nodes={self.hostname} Default=YES MaxTime=INFINITE State=UP
""")
        dbd_conf = etc / "slurmdbd.conf"
        dbd_conf.write_text(f"""\
{munge_auth}
AuthType=auth/munge
DbdHost={self.hostname}
DbdAddr=127.0.0.1
DbdPort={self.ports["slurmdbd"]}
SlurmUser=root
LogFile={log / "slurmdbd.log"}
PidFile={run / "slurmdbd.pid"}
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.ports["mariadb"]}
StorageUser={DB_USER}
StoragePass={DB_PASSWORD}
StorageLoc={DB_NAME}
""")
        dbd_conf.chmod(0o600)  # slurmdbd refuses a world-readable file holding a password

    # -- daemons --------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.stdout", "ab")
        self.processes[name] = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()

    def _start_munge(self, deadline: float) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={self.munge_socket}",
                f"--pid-file={self.root / 'run' / 'munged.pid'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
                f"--seed-file={self.root / 'munge' / 'munged.seed'}",
            ],
        )
        self._wait(self.munge_socket.exists, "munge socket", deadline, "munged")

    def _start_mariadb(self, deadline: float) -> None:
        datadir = self.root / "mysql" / "data"
        subprocess.run(
            [
                "mariadb-install-db",
                f"--datadir={datadir}",
                "--user=root",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        self._spawn(
            "mariadbd",
            [
                "mariadbd",
                "--no-defaults",
                f"--datadir={datadir}",
                "--user=root",
                f"--socket={self.db_socket}",
                f"--port={self.ports['mariadb']}",
                "--bind-address=127.0.0.1",
                f"--pid-file={self.root / 'run' / 'mariadbd.pid'}",
                f"--log-error={self.root / 'log' / 'mariadbd.log'}",
                "--innodb-buffer-pool-size=64M",
                "--innodb-log-file-size=48M",
                "--skip-log-bin",
            ],
        )
        self._wait(
            lambda: self._ok(["mariadb", f"--socket={self.db_socket}", "-u", "root", "-e", "SELECT 1"]),
            "mariadb accepting connections",
            deadline,
            "mariadbd",
        )
        sql = (
            f"CREATE DATABASE IF NOT EXISTS {DB_NAME}; "
            f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{DB_PASSWORD}'; "
            f"CREATE USER IF NOT EXISTS '{DB_USER}'@'localhost' IDENTIFIED BY '{DB_PASSWORD}'; "
            f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1'; "
            f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'localhost'; FLUSH PRIVILEGES;"
        )
        subprocess.run(
            ["mariadb", f"--socket={self.db_socket}", "-u", "root", "-e", sql],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def _ok(self, argv: list[str], expect: str | None = None) -> bool:
        try:
            result = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=20)
        except subprocess.TimeoutExpired:
            return False
        return result.returncode == 0 and (expect is None or expect in result.stdout)

    def _node_idle(self) -> bool:
        result = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, env=self.env, timeout=20
        )
        return result.returncode == 0 and result.stdout.strip() in ("idle", "mix", "alloc")

    def _wait(self, ready, what: str, deadline: float, daemon: str) -> None:
        while time.monotonic() < deadline:
            process = self.processes.get(daemon)
            if process is not None and process.poll() is not None:
                raise ClusterError(
                    f"{daemon} exited with status {process.returncode} while waiting for {what}\n"
                    + self.logs()
                )
            if ready():
                return
            time.sleep(0.5)
        raise ClusterError(f"timed out waiting for {what}\n" + self.logs())

    # -- diagnostics ----------------------------------------------------------------------

    def logs(self, lines: int = 40) -> str:
        """The last ``lines`` lines of every daemon log, for failure messages."""
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"==> {path.name} <==\n" + "\n".join(tail))
        return "\n".join(parts)

    def sacct(
        self, fields: list[str], all_steps: bool = False, duplicates: bool = False
    ) -> list[dict[str, str]]:
        """Every job in the accounting database as dictionaries of ``fields``.

        ``-X`` (allocations, not steps) unless ``all_steps``; ``duplicates`` adds ``-D``: one
        record per run of a job, so a requeued job shows its REQUEUED run(s) before the last.
        """
        argv = ["sacct", "-a", "-n", "-P", "--starttime=now-1days", "--format=" + ",".join(fields)]
        if not all_steps:
            argv.append("-X")
        if duplicates:
            argv.append("-D")
        result = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=30, check=True)
        return [dict(zip(fields, line.split("|"))) for line in result.stdout.splitlines() if line.strip()]
