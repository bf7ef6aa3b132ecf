"""The options of ``attnid train`` (attnid.training.config), the case registry
(attnid.training.cases), and the pipeline config's schema (attnid.plan.schema), whose case names come
from the registry and whose run settings come from the options."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from attnid.cli import build_parser
from attnid.model import options as model_options
from attnid.plan.schema import config_schema
from attnid.training import cases, config
from attnid.training import options as training_options

JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}


def schema_training_options(document: dict) -> dict[str, dict]:
    """Every training option the pipeline config may set, with its schema, from every section that
    holds them."""
    defs, properties = document["$defs"], document["properties"]
    sections = [
        defs["case"]["properties"],
        defs["sweep"]["properties"],
        properties["model"]["properties"],
        properties["training"]["properties"],
    ]
    options: dict[str, dict] = {}
    for section in sections:
        for name, spec in section.items():
            if name in ("lrs", "seeds"):  # the sweep's grid, not an option of one run
                continue
            options[name] = spec
    for name in ("device", "threads"):  # top-level keys passed to every training job
        options[name] = properties[name]
    return options


def test_schema_case_enum_is_the_case_registry():
    """The plan validates against the schema with the registry's case names
    (tests/workflow/test_workflow.py)."""
    assert config_schema()["$defs"]["case_name"]["enum"] == list(cases.CASES)


def test_schema_options_are_train_options_of_the_same_type():
    options = schema_training_options(config_schema())
    assert set(options) <= set(config.option_names()), set(options) - set(config.option_names())
    for name, spec in options.items():
        if "enum" in spec:
            allowed = {
                "rebalance_target": model_options.REBALANCE_TARGETS,
                "device": training_options.DEVICES,
                "rebalance_moments": training_options.REBALANCE_MOMENTS,
                "dtype": ("auto", *training_options.DTYPES),
                "metrics_device": ("auto", "host", "device"),
                "initial_point": model_options.INITIAL_POINTS,
            }[name]
            assert tuple(spec["enum"]) == allowed, name
        else:
            assert spec["type"] == JSON_TYPES[config.option_type(name)], name


def test_every_option_has_a_type_and_help():
    hints = {f.name: config.option_type(f.name) for f in fields(config.TrainConfig)}
    assert set(hints.values()) <= {int, float, bool, str}
    assert (
        hints["lr"] is float
        and hints["warmup_iters"] is int
        and hints["bias"] is bool
        and hints["case"] is str
    )
    hidden = [f.name for f in fields(config.TrainConfig) if config.help_text(f.name) is None]
    assert hidden == ["stop_after"]
    assert set(config.resume_free_keys()) == {
        "data",
        "out",
        "threads",
        "metrics_threads",
        "fresh",
        "restart_if_changed",
        "stop_after",
        "progress_every",
        "arm",  # a name for the tables, not a setting of the run
        "full_val_eval",  # an evaluation after the last step, not a setting of the training
        "full_val_every",  # evaluations along the way: what is logged, not what is trained
    }


def test_help_lists_cases_and_their_default_lrs():
    parser = build_parser("train")
    train_parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "train"
    ]
    text = " ".join(train_parser.format_help().split())
    assert (
        "optimizer case: sgd, sgd_wd, sgd_momentum, adamw, adamw_rebalance, adamw_projected, "
        "adamw_gauge_fixed, sgd_gauge_fixed"
    ) in text
    for case in cases.CASES.values():
        assert f"{case.name} {case.default_lr:g}" in text
    assert "--stop-after" not in text


def test_cases_are_one_record_each():
    assert list(cases.CASES) == [
        "sgd",
        "sgd_wd",
        "sgd_momentum",
        "adamw",
        "adamw_rebalance",
        "adamw_projected",
        "adamw_gauge_fixed",
        "sgd_gauge_fixed",
    ]
    assert cases.rebalancing_cases() == ["adamw_rebalance"]
    assert [c.name for c in cases.CASES.values() if c.projects_steps] == ["adamw_projected"]
    assert [c.name for c in cases.CASES.values() if c.gauge_fixed] == ["adamw_gauge_fixed", "sgd_gauge_fixed"]
    assert {c.name: c.default_lr for c in cases.CASES.values()} == {
        "sgd": 0.1,
        "sgd_wd": 0.1,
        "sgd_momentum": 0.01,
        "adamw": 1e-3,
        "adamw_rebalance": 1e-3,
        "adamw_projected": 1e-3,
        "adamw_gauge_fixed": 1e-3,
        "sgd_gauge_fixed": 0.1,
    }
    # the interventions train adamw's optimizer (docs/design.md §13, §14), the SGD control sgd's
    assert {
        cases.CASES[name].make_optimizer
        for name in ("adamw_rebalance", "adamw_projected", "adamw_gauge_fixed")
    } == {cases.adamw}
    assert cases.CASES["sgd_gauge_fixed"].make_optimizer is cases.sgd
    styles = [(c.color, c.linestyle, c.marker) for c in cases.CASES.values()]
    assert len({color for color, _, _ in styles}) == len(styles)
    with pytest.raises(ValueError, match="already registered"):
        cases.register(cases.CASES["sgd"])
    cfg = config.resolve_config({"data": "d", "out": "o", "case": "sgd_momentum"})
    assert cfg.lr == 0.01
