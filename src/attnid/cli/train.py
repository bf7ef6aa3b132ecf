"""``attnid train``: one training run (:mod:`attnid.training.train`); its options are
:class:`attnid.training.config.TrainConfig`'s, one flag per field."""

from __future__ import annotations

import argparse

from attnid.common import outputs
from attnid.training import rundir
from attnid.training.config import add_train_arguments, config_from_args  # noqa: F401 - the command's parser
from attnid.training.train import train


def run_train(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    rule = outputs.current()
    rule.read(args.config, cfg.data)
    out = rule.write_dir(cfg.out, "--out")
    rule.write(out / rundir.METRICS_FILE, outputs.CSV)
    rule.write(out / rundir.RUN_FILE, rundir.RUN_JSON)
    # without --fresh, a ckpt.pt that is not a checkpoint of this run is moved aside, never overwritten
    rule.write(out / rundir.CHECKPOINT_FILE, outputs.TORCH_ARCHIVE if cfg.fresh else outputs.ANY)
    return train(cfg)
