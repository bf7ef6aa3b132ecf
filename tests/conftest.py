"""Shared fixtures. Tests run single-threaded torch so two of them can share 2 cores."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
# The repository ships tiny shakespeare, so a bare clone tests offline with no setup.
SHIPPED_SHAKESPEARE = REPO / "assets" / "tinyshakespeare.txt"


def pytest_configure(config: pytest.Config) -> None:
    import pipeline_helpers  # its say() prints past the output capture, through the capture manager

    pipeline_helpers.PYTEST_CONFIG = config


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shakespeare_path() -> Path:
    """The tiny shakespeare text: the shipped copy, or the file ``ATTNID_SHAKESPEARE`` names.

    A missing or altered file is a failure, not a skip.
    """
    path = Path(os.environ.get("ATTNID_SHAKESPEARE") or SHIPPED_SHAKESPEARE)
    if not path.is_file():
        pytest.fail(
            f"tiny shakespeare not found at {path}: restore assets/tinyshakespeare.txt from git "
            f"(or point ATTNID_SHAKESPEARE at a copy)"
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SHAKESPEARE_SHA256:
        pytest.fail(f"{path} has sha256 {digest}, expected {SHAKESPEARE_SHA256}: not tiny shakespeare")
    return path


@pytest.fixture(scope="session")
def shakespeare_url(shakespeare_path: Path) -> str:
    return shakespeare_path.resolve().as_uri()


# On a loaded machine a command can take more than the heartbeat's 8 s to import torch; a progress line
# would then join the one-line errors that many tests count (tests/cli/test_cli_fuzz.py tests the heartbeat).
os.environ.setdefault("ATTNID_PROGRESS_S", "120")


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
    from attnid.training.data import prepare

    out_dir = tmp_path_factory.mktemp("prepared") / "shakespeare_char"
    prepare(shakespeare_path, out_dir)
    return out_dir
