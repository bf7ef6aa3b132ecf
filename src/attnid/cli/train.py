"""``attnid train``: one training run (:mod:`attnid.training.train`). Its flags are generated from
:class:`attnid.training.config.TrainConfig`, one per field, so an option is added in one place."""

from __future__ import annotations

import argparse
import sys
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


def declare_run_outputs(cfg: TrainConfig, config_file: str | None, flag: str = "--out") -> None:
    """The output rule's view of one run (docs/design.md §6.1): its config file and data are read, its run
    directory written; its checkpoint outlives a failure, so that a rerun resumes from it."""
    # lazy: torch and pandas, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.training import rundir

    rule = outputs.current()
    rule.read(config_file, cfg.data)
    assert cfg.out is not None  # resolve_config requires --out
    out = rule.write_dir(cfg.out, flag)
    rule.write(out / rundir.METRICS_FILE, outputs.CSV)
    rule.write(out / rundir.RUN_FILE, rundir.RUN_JSON)
    # without --fresh, a ckpt.pt that is not a checkpoint of this run is moved aside, never overwritten
    rule.write(out / rundir.CHECKPOINT_FILE, outputs.TORCH_ARCHIVE if cfg.fresh else outputs.ANY)
    rule.keep_on_failure(out / rundir.CHECKPOINT_FILE)


def run_train(args: argparse.Namespace) -> int:
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.training.train import train

    cfg = config_from_args(args)
    declare_run_outputs(cfg, args.config)
    return train(cfg)


# The options of `attnid train-runs` that every run takes from its command line, not from its config file.
JOB_FLAGS = ("data", "threads", "device")


def add_train_runs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--configs",
        nargs="+",
        required=True,
        metavar="FILE",
        help="one 'attnid train --config' file per run, in the order they train",
    )
    parser.add_argument(
        "--outs", nargs="+", required=True, metavar="RUN_DIR", help="each run's --out, in the same order"
    )
    for name in JOB_FLAGS:
        f = next(f for f in fields(TrainConfig) if f.name == name)
        parser.add_argument(
            "--" + name,
            type=option_type(name),
            default=None,
            metavar=f.metadata["metavar"],
            help=help_text(name),
        )
    # the workflow's per-arm jobs pass it, as each `attnid train` job does (workflow/rules/interventions.smk)
    parser.add_argument(
        "--restart-if-changed", action="store_true", default=None, help=help_text("restart_if_changed")
    )
    parser.add_argument(
        "--lockstep",
        action="store_true",
        help="train the runs that differ only in their seed together, one stacked step of all at a time "
        "(--no-metrics runs of a case without orbit moves; the same runs to float rounding, faster for "
        "small models: docs/design.md §11.6)",
    )


def run_train_runs(args: argparse.Namespace) -> int:
    """Each run as ``attnid train --config FILE --out RUN_DIR`` would train it, one after another in this
    process: the start-up (importing torch and the optimizers) is paid once (docs/experiments.md). Every
    run is checked and its outputs declared before the first trains; a stop signal stops after saving the
    run it interrupts (rerunning the command resumes it and skips the finished ones)."""
    # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
    from attnid.training.train import train

    if len(args.configs) != len(args.outs):
        raise UserError(
            f"{len(args.configs)} --configs and {len(args.outs)} --outs: give one --out per config"
        )
    if len(set(args.outs)) != len(args.outs):
        raise UserError("two runs with the same --outs directory: each run needs its own")
    flags = {
        name: getattr(args, name)
        for name in (*JOB_FLAGS, "restart_if_changed")
        if getattr(args, name) is not None
    }
    runs = []
    for config_file, out in zip(args.configs, args.outs, strict=True):
        cfg = resolve_config(read_config_file(config_file) | flags | {"out": out})
        declare_run_outputs(cfg, config_file, "--outs")
        runs.append(cfg)
    if args.lockstep:
        # lazy: torch, which --help must not import (tests/cli/test_cli_help.py)
        from attnid.training.lockstep import train_together

        return train_together(runs)
    for number, cfg in enumerate(runs, start=1):
        print(f"attnid train-runs: run {number}/{len(runs)}: {cfg.out}", file=sys.stderr, flush=True)
        status = train(cfg)
        if status:
            return status
    return 0
