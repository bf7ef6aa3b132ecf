"""Atomic writes: all or nothing, and the usual file mode."""

from __future__ import annotations

import os

import pytest

from attnid.common.files import atomic_path, write_text_atomic


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.csv"
    write_text_atomic(target, "complete\n")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half a fi")
            raise RuntimeError("killed mid-write")
    assert target.read_text() == "complete\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]


def test_output_mode_follows_umask_not_mkstemp(tmp_path):
    old = os.umask(0o022)
    try:
        path = write_text_atomic(tmp_path / "sub" / "table.tex", "x")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644
