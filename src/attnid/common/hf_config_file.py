"""The ``config.json`` of a Hugging Face model, read with one-line errors.

Reading is kept out of :mod:`attnid.theory` (pure functions): the command line and the checkpoint
loaders read the file here and hand its settings to :mod:`attnid.theory.hf_config`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from attnid.common.errors import UserError


def hf_config_path(path: str | os.PathLike) -> Path:
    """``path`` itself, or the ``config.json`` in it when it is a folder."""
    path = Path(path)
    return path / "config.json" if path.is_dir() else path


def read_hf_config(path: str | os.PathLike) -> dict:
    """The JSON object of ``path`` (a ``config.json``, or a folder that holds one)."""
    path = hf_config_path(path)
    if not path.is_file():
        raise UserError(
            f"Hugging Face config {path} not found: pass a config.json or the model folder holding one"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{path} is not valid JSON: {err}") from None
    except RecursionError:  # nesting deeper than the parser's stack: no config is like that
        raise UserError(f"{path} is not a model config: its JSON is nested too deeply to read") from None
    if not isinstance(config, dict):
        raise UserError(f"{path} must hold a JSON object of model settings")
    return config
