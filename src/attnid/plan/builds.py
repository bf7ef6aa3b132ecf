"""One build of a ``results_dir`` at a time (docs/cluster.md, "Two builds, or a dry run beside a build").

The workflow runs a build (not a dry run, ``--lint``, ``--report``, nor a job's own parse of the
Snakefile) inside :func:`one_build`, from before Snakemake reads its records of incomplete jobs to the
build's end however it ends, so that a second build of the same folder stops in one line naming the
first, never at Snakemake's own checks (whose advice, ``--rerun-incomplete``, would rerun the running
build's jobs). The lock is :class:`attnid.common.locks.BuildLock`.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

from attnid.common.errors import UserError
from attnid.common.locks import BuildLock


@contextlib.contextmanager
def one_build(results_dir: str | os.PathLike, say: Callable[[str], None]) -> Iterator[None]:
    """Hold ``results_dir``'s build lock for the body. Held by another build: ``say`` its one line and
    exit 1; taken over from a build that is gone: ``say`` that, in one line, and go on."""
    lock = BuildLock(results_dir)
    try:
        lock.acquire()
    except UserError as err:
        say(str(err))
        raise SystemExit(1) from None
    if lock.taken_over:
        say(lock.taken_over)
    try:
        yield
    finally:
        lock.release()


def as_one_build(
    execute: Callable[..., Any],
    results_dir: str | os.PathLike,
    dry: Callable[..., bool],
    say: Callable[[str], None],
) -> Callable[..., Any]:
    """``execute`` (Snakemake's ``Workflow.execute``, called with its arguments) run in :func:`one_build`
    unless ``dry(its arguments)``. Defined here, not in the Snakefile, so that Snakemake does not name the
    Snakefile's line as the place of a failed build's error."""

    @functools.wraps(execute)
    def execute_as_one_build(*args: Any, **kwargs: Any) -> Any:
        if dry(*args, **kwargs):
            return execute(*args, **kwargs)
        with one_build(results_dir, say):
            return execute(*args, **kwargs)

    return execute_as_one_build
