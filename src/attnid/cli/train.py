"""``attnid train``: one training run (:mod:`attnid.training.train`). Its flags are generated from
:class:`attnid.training.config.TrainConfig`, one per field, so an option is added in one place."""

from __future__ import annotations

import argparse
from dataclasses import fields

from attnid.common import outputs
from attnid.common.errors import UserError
from attnid.training.config import (
    REPLACED_OPTIONS,
    TrainConfig,
    help_text,
    option_names,
    option_type,
    read_config_file,
    resolve_config,
)


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="YAML file with any of these options (underscored keys); "
        "flags given on the command line override it",
    )
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        kind, text = option_type(f.name), help_text(f.name)
        if text is None:
            parser.add_argument(flag, type=kind, default=None, help=argparse.SUPPRESS)
        elif kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            parser.add_argument(flag, type=kind, default=None, metavar=f.metadata["metavar"], help=text)
    for name in REPLACED_OPTIONS:  # accepted by the parser only to say what replaced them
        parser.add_argument(
            "--" + name.replace("_", "-"), action="store_true", default=None, help=argparse.SUPPRESS
        )


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    for name, message in REPLACED_OPTIONS.items():
        if getattr(args, name, None):
            raise UserError(message)
    values = read_config_file(args.config) if getattr(args, "config", None) else {}
    for name in option_names():  # explicit flags override the file
        flag_value = getattr(args, name, None)
        if flag_value is not None:
            values[name] = flag_value
    return resolve_config(values)


def run_train(args: argparse.Namespace) -> int:
    # lazy: torch and pandas, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.training import rundir
    from attnid.training.train import train

    cfg = config_from_args(args)
    rule = outputs.current()
    rule.read(args.config, cfg.data)
    assert cfg.out is not None  # resolve_config requires --out
    out = rule.write_dir(cfg.out, "--out")
    rule.write(out / rundir.METRICS_FILE, outputs.CSV)
    rule.write(out / rundir.RUN_FILE, rundir.RUN_JSON)
    # without --fresh, a ckpt.pt that is not a checkpoint of this run is moved aside, never overwritten
    rule.write(out / rundir.CHECKPOINT_FILE, outputs.TORCH_ARCHIVE if cfg.fresh else outputs.ANY)
    rule.keep_on_failure(out / rundir.CHECKPOINT_FILE)  # a rerun resumes from it
    return train(cfg)
