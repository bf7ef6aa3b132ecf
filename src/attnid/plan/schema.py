"""The pipeline config's schema: its structure (``config.schema.yaml``, package data) completed with the
settings of a training run generated from :class:`attnid.training.config.TrainConfig` (docs/design.md §6).

A setting of a run is declared once, as a field of ``TrainConfig``: its type, its bounds (``bound``,
``maximum``, ``below``), its values (``choices``) and its help. Each section of a config that sets
settings of runs names a set of fields (:data:`SECTION_SETTINGS`) and gets one property per field, typed
and bounded as the field is; adding a field to ``TrainConfig`` adds it to the schema of every section
whose set takes it (``training`` takes every run setting that is not the model's, a case's ``lr`` or one
of the workflow's own options).
"""

from __future__ import annotations

import functools
from dataclasses import fields
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from attnid.plan.errors import ConfigError
from attnid.plan.interventions import ARM_SETTINGS
from attnid.training.cases import case_names
from attnid.training.config import TrainConfig, help_text, option_type

SCHEMA_FILE = Path(__file__).resolve().parent / "config.schema.yaml"
JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}

# TrainConfig options that no section of a config sets: the workflow gives them per job (the data, the run
# directory, the case and seed from the config's structure, threads and device from its top-level keys),
# or they steer the process, not the run.
JOB_OPTIONS = (
    "data", "out", "case", "seed", "threads", "device", "fresh", "restart_if_changed", "stop_after",
    "progress_every",
)  # fmt: skip
# The model section: the shape every run of the config shares.
MODEL_SETTINGS = ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "dropout", "bias")
# The attention shape a study point sets for its runs (attnid.plan.studies.StudyPoint.architecture).
ARCHITECTURE_SETTINGS = ("n_embd", "n_head", "n_kv_head", "head_dim", "rope")
# Set by each case itself (cases/<case>/lr is required) or by a sweep's grid.
CASE_LR = "lr"
# The interventions section's own settings apply to every run of the stage: its lr, and not those that make
# an arm what it is (ARM_SETTINGS: its moments, starting point, frozen entries, own lr and name).
# The identity run trains in float64 (attnid.plan.interventions.IDENTITY_DTYPE) and measures, whatever else
# it or the stage sets.
IDENTITY_FIXED = ("dtype", "metrics")


def training_settings() -> tuple[str, ...]:
    """Every setting of a run that the ``training`` section may set: each TrainConfig field that is not a
    job option, the model's, a study point's attention shape or a case's learning rate."""
    taken = {*JOB_OPTIONS, *MODEL_SETTINGS, *ARCHITECTURE_SETTINGS, CASE_LR}
    return tuple(f.name for f in fields(TrainConfig) if f.name not in taken)


def section_settings() -> dict[str, tuple[str, ...]]:
    """{set name (``x-run-settings`` in config.schema.yaml): the TrainConfig fields its sections may set}."""
    training = training_settings()
    return {
        "model": MODEL_SETTINGS,
        "training": training,
        "case": (CASE_LR, *training),
        "sweep": training,
        "study": training,
        "edits": ("bias", *training),
        # the stage's own model and lr (its AdamW arms' and baselines', the calibration grid's centre), and
        # every training setting but what makes an arm what it is
        "interventions": (*MODEL_SETTINGS, CASE_LR, *(name for name in training if name not in ARM_SETTINGS)),
        "identity": tuple(name for name in training if name not in IDENTITY_FIXED),
        "arm": ARM_SETTINGS,
        "variant": ("n_kv_head", "rope"),
    }


def option_schema(name: str) -> dict[str, Any]:
    """The JSON schema of TrainConfig's field ``name``: its type (or its choices), its bounds and its help."""
    metadata = next(f.metadata for f in fields(TrainConfig) if f.name == name)
    kind = option_type(name)
    spec: dict[str, Any] = (
        {"enum": list(metadata["choices"])} if metadata.get("choices") else {"type": JSON_TYPES[kind]}
    )
    bound = metadata.get("bound")
    if bound == "positive":
        spec.update({"minimum": 1} if kind is int else {"exclusiveMinimum": 0})
    elif bound == "non_negative":
        spec["minimum"] = 0
    for key, keyword in (
        ("minimum", "minimum"),
        ("maximum", "maximum"),
        ("exclusive_minimum", "exclusiveMinimum"),
        ("exclusive_maximum", "exclusiveMaximum"),
        ("below", "exclusiveMaximum"),
    ):
        if metadata.get(key) is not None:
            spec[keyword] = metadata[key]
    text = help_text(name)
    if text:
        spec["description"] = text
    return spec


@functools.cache
def _schema_text() -> str:
    return SCHEMA_FILE.read_text(encoding="utf-8")


def _complete(node: Any, sets: dict[str, tuple[str, ...]]) -> Any:
    """``node`` with its ``x-train-option`` and ``x-run-settings`` markers replaced (config.schema.yaml)."""
    if isinstance(node, list):
        return [_complete(item, sets) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _complete(value, sets) for key, value in node.items()}
    if "x-train-option" in node:
        name = node.pop("x-train-option")
        node = option_schema(name) | node
    if "x-run-settings" in node:
        own = node.get("properties", {})
        settings = {
            name: option_schema(name) | own.get(name, {}) for name in sets[node.pop("x-run-settings")]
        }
        node["properties"] = settings | {key: value for key, value in own.items() if key not in settings}
    return node


def config_schema() -> dict:
    """The pipeline config's schema: config.schema.yaml completed (:func:`_complete`), with
    ``$defs/case_name`` the names of the case registry (the one list of cases, attnid.training.cases)."""
    schema = _complete(yaml.safe_load(_schema_text()), section_settings())
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
        raise ConfigError("/".join(map(str, err.absolute_path)) or "(top level)", err.message) from None
