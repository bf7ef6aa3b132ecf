"""The pipeline config's contracts with the ``attnid`` package, as plain Python that the tests import.

common.smk reads the config through these functions; the .smk files hold the rules. Three contracts:

- :data:`TRAIN_FLAGS`, the one table of which setting of a training run (a key of the config's
  ``model``, ``training``, ``cases``, ``sweep``, ``heads``/``variants``, ``edits`` and ``interventions``
  sections, and the job's seed) becomes which ``attnid train`` flag. A setting without an entry is a
  config error at parse time, never a failed job; tests/test_workflow.py checks the table against
  ``attnid train --help`` and against the schema.
- :func:`config_schema`: workflow/schemas/config.schema.yaml with its case list taken from the case
  registry (:data:`attnid.training.cases.CASES`), so that adding a case touches only that module.
- :func:`yaml_error` and :func:`unwritable`: a broken config file or an output folder that cannot be
  written is one ``config error:`` line before any job starts.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import yaml

from attnid.training.cases import case_names

SCHEMA = Path(__file__).resolve().parent.parent / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """A problem of the user's config, one line naming the key (common.smk prints it as ``config error:``)."""


@dataclass(frozen=True)
class TrainFlag:
    """One ``attnid train`` option and the type of its value."""

    flag: str
    kind: type  # int, float, str or bool

    def text(self, value) -> str:
        """The option as it appears in the shell command: ``--flag VALUE``; a bool is ``--flag`` or
        ``--no-flag``."""
        if self.kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"{self.flag} takes true or false, not {value!r}")
            return self.flag if value else f"--no-{self.flag[2:]}"
        return f"{self.flag} {value}"


# Setting (config key) -> `attnid train` flag. The rules add --data, --out, --threads and --device
# (threads is Snakemake's own job setting, which --set-threads may change).
TRAIN_FLAGS = {
    # model: (and the identification studies' attention shapes)
    "n_layer": TrainFlag("--n-layer", int),
    "n_head": TrainFlag("--n-head", int),
    "n_embd": TrainFlag("--n-embd", int),
    "n_kv_head": TrainFlag("--n-kv-head", int),
    "head_dim": TrainFlag("--head-dim", int),
    "rope": TrainFlag("--rope", bool),
    "block_size": TrainFlag("--block-size", int),
    "batch_size": TrainFlag("--batch-size", int),
    "dropout": TrainFlag("--dropout", float),
    "bias": TrainFlag("--bias", bool),
    # training:, and the per-section step counts of sweeps, studies and edits
    "max_iters": TrainFlag("--max-iters", int),
    "log_every": TrainFlag("--log-every", int),
    "eval_every": TrainFlag("--eval-every", int),
    "warmup_iters": TrainFlag("--warmup-iters", int),
    "ckpt_every": TrainFlag("--ckpt-every", int),
    "tau_every": TrainFlag("--tau-every", int),
    "metrics_threads": TrainFlag("--metrics-threads", int),
    # cases: and sweep:
    "lr": TrainFlag("--lr", float),
    "weight_decay": TrainFlag("--weight-decay", float),
    "rebalance_every": TrainFlag("--rebalance-every", int),
    "rebalance_target": TrainFlag("--rebalance-target", str),
    "rebalance_moments": TrainFlag("--rebalance-moments", str),
    "dtype": TrainFlag("--dtype", str),
    # one per job, from the seeds lists
    "seed": TrainFlag("--seed", int),
}


def run_flags(case: str, settings: dict) -> str:
    """The ``attnid train`` flags of one run, in the order of ``settings``: the one command builder of
    every training rule (cases, sweeps, studies, edits)."""
    flags = [f"--case {case}"]
    for key, value in settings.items():
        if key not in TRAIN_FLAGS:
            raise ConfigError(
                f"setting '{key}' has no `attnid train` flag in TRAIN_FLAGS "
                f"(workflow/rules/pipeline_config.py)"
            )
        flags.append(TRAIN_FLAGS[key].text(value))
    return " ".join(flags)


def config_schema() -> dict:
    """The config schema, with ``$defs/case_name`` the names of the case registry.

    The file's own ``case_name`` accepts any lower-case name, so it stays a valid schema on its own;
    the registry is the one list of cases (attnid.training.cases)."""
    schema = yaml.safe_load(SCHEMA.read_text(encoding="utf-8"))
    schema["$defs"]["case_name"] = {"enum": case_names()}
    return schema


def _with_defaults(validator_class):
    """``validator_class`` that also fills in each property's ``default`` (the jsonschema FAQ's recipe,
    as snakemake.utils.validate does)."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        for name, subschema in properties.items():
            if "default" in subschema and isinstance(instance, dict):
                instance.setdefault(name, subschema["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


def validate_config(config: dict) -> None:
    """Check ``config`` against :func:`config_schema` and fill in its defaults, in place.

    The first problem found is a :class:`ConfigError` naming its key, e.g. ``cases/sgd/lr: -0.1 is less
    than or equal to the minimum of 0``."""
    schema = config_schema()
    validator_class = jsonschema.validators.validator_for(schema)
    try:
        _with_defaults(validator_class)(schema).validate(config)
    except jsonschema.ValidationError as err:
        where = "/".join(map(str, err.absolute_path)) or "(top level)"
        raise ConfigError(f"{where}: {err.message}") from None


def yaml_error(path: str | os.PathLike) -> str | None:
    """Where and why the YAML file ``path`` does not parse (``FILE, line L, column C: problem``), or None."""
    try:
        yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
        return f"{where}: {err.problem or err.context} (not valid YAML)"
    except yaml.YAMLError as err:
        return f"{path}: {str(err).splitlines()[0]} (not valid YAML)"
    return None


def unwritable(path: str | os.PathLike) -> str | None:
    """Why no directory can be made and written at ``path``, or None when one can.

    Found by making and removing a directory in ``path`` or in its nearest existing parent:
    ``os.access`` cannot tell (root passes it under /proc; it ignores quotas and most mounts)."""
    parent = Path(path)
    try:
        while not parent.exists():
            parent = parent.parent
    except OSError as err:
        return f"{parent}: {err.strerror}"
    if not parent.is_dir():
        return f"{parent} is not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".attnid-write-check-", dir=parent))
    except OSError as err:
        return f"cannot create a directory in {parent} ({err.strerror})"
    return None
