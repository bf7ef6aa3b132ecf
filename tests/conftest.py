"""Shared fixtures. Tests run single-threaded torch so two of them can share 2 cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


def _find_shakespeare() -> Path | None:
    candidates = [os.environ.get("ATTNID_SHAKESPEARE", ""), REPO.parent / "shared" / "data" / "tinyshakespeare.txt",
                  REPO / "data" / "tinyshakespeare.txt"]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shakespeare_path() -> Path:
    """The tiny shakespeare text. Missing data is a failure, not a skip."""
    path = _find_shakespeare()
    if path is None:
        pytest.fail("tiny shakespeare not found: set ATTNID_SHAKESPEARE or put it at ../shared/data/tinyshakespeare.txt")
    return path


@pytest.fixture(scope="session")
def shakespeare_url(shakespeare_path: Path) -> str:
    return shakespeare_path.resolve().as_uri()


@pytest.fixture(autouse=True, scope="session")
def _single_thread_torch():
    try:
        import torch
    except ImportError:  # packaging tests do not need torch
        yield
        return
    torch.set_num_threads(1)
    yield


@pytest.fixture(scope="session")
def prepared_data_dir(shakespeare_path: Path, tmp_path_factory) -> Path:
    """tiny shakespeare encoded by ``attnid prepare`` (train.bin, val.bin, meta.json), once per session.

    Treat it as read-only: copy it before corrupting anything.
    """
    from attnid.data import prepare

    out_dir = tmp_path_factory.mktemp("prepared") / "shakespeare_char"
    prepare(shakespeare_path, out_dir)
    return out_dir
