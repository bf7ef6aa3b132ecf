"""The ``config.json`` of a Hugging Face model, read with one-line errors.

Reading is kept out of :mod:`attnid.theory` (pure functions): the command line and the checkpoint
loaders read the file here and hand its settings to :mod:`attnid.theory.hf_config`.
"""

from __future__ import annotations

import os
from pathlib import Path

from attnid.common.errors import UserError
from attnid.common.files import read_json
from attnid.common.paths import special_kind


def hf_config_path(path: str | os.PathLike) -> Path:
    """``path`` itself, or the ``config.json`` in it when it is a folder."""
    path = Path(path)
    return path / "config.json" if path.is_dir() else path


def read_hf_config(path: str | os.PathLike) -> dict:
    """The JSON object of ``path`` (a ``config.json``, or a folder that holds one); a FIFO, a device, a
    huge or deeply nested file is one line (:func:`attnid.common.files.read_json`)."""
    path = hf_config_path(path)
    if not path.is_file() and special_kind(path) is None:
        raise UserError(
            f"Hugging Face config {path} not found: pass a config.json or the model folder holding one"
        )
    config = read_json(path, "Hugging Face config")
    if not isinstance(config, dict):
        raise UserError(f"{path} must hold a JSON object of model settings")
    return config
