"""The alignment stage's plan (docs/design.md §18): which pairs of seeds the default, smoke and other configs
align, each read where its checkpoint is (a study the config turns off: no pair), and a bad section as one
config error naming its key."""

from __future__ import annotations

import copy
import dataclasses
import itertools

import pytest
import yaml

from attnid.plan import alignment_pairs, plan
from attnid.plan.errors import ConfigError


@pytest.fixture(scope="module")
def configs(repo_root) -> dict:
    return {
        name: yaml.safe_load((repo_root / "config" / f"{name}.yaml").read_text())
        for name in ("config", "smoke")
    }


def _pairs(config: dict, overrides: dict | None = None):
    config = copy.deepcopy(config)
    planned = plan(config, overrides or {})
    return planned, alignment_pairs(config, planned)


def test_the_default_build_aligns_15_case_pairs_and_15_head_pairs(configs):
    planned, pairs = _pairs(configs["config"])
    config = configs["config"]
    cases = [p for p in pairs if p.study == "cases"]
    heads = [p for p in pairs if p.study == "heads"]
    assert len(cases) == 15 and len(heads) == 15 and len({p.name for p in pairs}) == 30
    expected = {
        (case, a, b) for case in config["cases"] for a, b in itertools.combinations(config["seeds"], 2)
    }
    assert {(p.group, p.seed_a, p.seed_b) for p in cases} == expected
    assert sorted({p.group for p in heads}) == sorted(f"h{n}" for n in config["heads"]["n_heads"])
    for pair in pairs:  # each end is a run the plan trains itself (a checkpoint of its own)
        for run in (pair.run_a, pair.run_b):
            assert run in planned.runs and planned.runs[run].copied_from is None
        assert pair.run_a.endswith(f"/{pair.group}/seed{pair.seed_a}")


def test_one_seed_per_group_is_no_pair(configs):
    _, pairs = _pairs(configs["config"], {"seeds": [0], "heads": {"seeds": [0]}})
    assert pairs == []


def test_the_section_off_or_narrowed(configs):
    assert _pairs(configs["config"], {"alignment": None})[1] == []
    assert {p.study for p in _pairs(configs["config"], {"heads": None})[1]} == {"cases"}  # the study is off
    _, cases = _pairs(configs["config"], {"alignment": {"studies": ["cases"]}, "seeds": [0, 1, 2, 3]})
    assert len(cases) == 5 * 6 and {p.study for p in cases} == {"cases"}


def test_a_copied_run_is_read_from_its_source(configs):
    """A run the plan copies from an identical earlier run has no ckpt.pt: its pair reads the source's."""
    config = copy.deepcopy(configs["config"])
    planned = plan(config, {})
    run = f"{planned.results_dir}/studies/heads/h4/seed1"
    planned.runs[run] = dataclasses.replace(planned.runs[run], copied_from="elsewhere/seed1")
    pairs = [p for p in alignment_pairs(config, planned) if p.group == "h4"]
    assert [(p.run_a, p.run_b) for p in pairs if 1 in (p.seed_a, p.seed_b)] == [
        (f"{planned.results_dir}/studies/heads/h4/seed0", "elsewhere/seed1"),
        ("elsewhere/seed1", f"{planned.results_dir}/studies/heads/h4/seed2"),
    ]


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"alignment": {"studies": ["variants"]}}, "alignment/studies"),
        ({"alignment": {"points": 1}}, "alignment/points"),
    ],
)
def test_a_bad_section_is_one_config_error_naming_the_key(configs, overrides, key):
    with pytest.raises(ConfigError) as caught:
        _pairs(configs["config"], overrides)
    assert key in str(caught.value) and "\n" not in str(caught.value)
