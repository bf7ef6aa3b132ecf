"""``attnid train``: one training run (:mod:`attnid.training.train`); its options are
:class:`attnid.training.config.TrainConfig`'s, one flag per field."""

from __future__ import annotations

import argparse

from attnid.training.config import add_train_arguments, config_from_args  # noqa: F401 - the command's parser
from attnid.training.train import train


def run_train(args: argparse.Namespace) -> int:
    return train(config_from_args(args))
