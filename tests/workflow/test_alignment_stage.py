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


def test_pairs_from_a_study_turned_off_pairs_nothing_of_it(configs):
    # `--config heads=null` on the smoke config (which pairs heads/h2) turns the study off, pairs included:
    # refusing would make the user edit a second section to turn one off
    overrides = {
        "heads": None,
        "alignment": {"pairs_from": {"cases": {"adamw": [0, 1]}, "heads": {"h4": [0, 1]}}},
    }
    planned, pairs = _pairs(configs["config"], overrides)
    assert [p.name for p in pairs] == ["cases/adamw/seed0-seed1"]
    assert not any("/studies/heads/" in run for run in planned.alignment_runs)


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


def test_the_smoke_build_pairs_its_declared_groups_training_their_other_seed_for_the_stage_alone(configs):
    """pairs_from: the smoke build's one seed per group, and a second seed of each group it pairs, trained
    for this stage alone (no case or study table reads it)."""
    planned, pairs = _pairs(configs["smoke"])
    declared = configs["smoke"]["alignment"]["pairs_from"]
    assert pairs and {(p.study, p.group) for p in pairs} == {
        (study, group) for study, groups in declared.items() for group in groups
    }
    for pair in pairs:
        seeds = declared[pair.study][pair.group]
        assert (pair.seed_a, pair.seed_b) in itertools.combinations(seeds, 2)
        for run in (pair.run_a, pair.run_b):
            assert run in planned.trained()
    own = {run for pair in pairs for run in (pair.run_a, pair.run_b)} - set(planned.case_runs)
    own -= {run for runs in planned.study_runs.values() for run in runs}
    assert own and sorted(own) == sorted(planned.alignment_runs)
    listed = [*planned.case_runs, *(run for runs in planned.study_runs.values() for run in runs)]
    assert not set(planned.alignment_runs) & set(listed)


def test_pairs_from_trains_the_case_s_or_point_s_settings_at_the_other_seed(configs):
    config = configs["config"]
    overrides = {"alignment": {"pairs_from": {"cases": {"adamw": [0, 7]}, "heads": {"h4": [2, 9]}}}}
    planned, pairs = _pairs(config, overrides)
    assert [p.name for p in pairs] == ["cases/adamw/seed0-seed7", "heads/h4/seed2-seed9"]
    root = planned.results_dir
    assert planned.alignment_runs == [f"{root}/runs/adamw/seed7", f"{root}/studies/heads/h4/seed9"]
    siblings = [
        ("runs/adamw/seed7", "runs/adamw/seed0"),
        ("studies/heads/h4/seed9", "studies/heads/h4/seed0"),
    ]
    for extra, sibling in siblings:
        mine, theirs = planned.runs[f"{root}/{extra}"], planned.runs[f"{root}/{sibling}"]
        assert mine.case == theirs.case and mine.settings["seed"] != theirs.settings["seed"]
        assert {**mine.settings, "seed": 0} == {**theirs.settings, "seed": 0}
    assert planned.case_runs == _pairs(config)[0].case_runs  # no case table reads the stage's own run


def test_pairs_from_null_is_every_group_of_the_studies(configs):
    config = copy.deepcopy(configs["smoke"])
    config["seeds"] = [0, 1]
    _, pairs = _pairs(config, {"alignment": {"pairs_from": None}})
    assert sorted(p.group for p in pairs) == sorted(config["cases"])


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"alignment": {"pairs_from": {"cases": {"adamw": [0]}}}}, "alignment/pairs_from/cases/adamw"),
        ({"alignment": {"pairs_from": {"cases": {"adamw_typo": [0, 1]}}}}, "alignment/pairs_from/cases"),
        ({"alignment": {"pairs_from": {"heads": {"h3": [0, 1]}}}}, "alignment/pairs_from/heads/h3"),
        ({"alignment": {"pairs_from": {"variants": {"mha": [0, 1]}}}}, "alignment/pairs_from"),
        (
            {"alignment": {"studies": ["cases"], "pairs_from": {"heads": {"h4": [0, 1]}}}},
            "alignment/pairs_from/heads",
        ),
    ],
)
def test_a_bad_pairs_from_is_one_config_error_naming_the_key(configs, overrides, key):
    with pytest.raises(ConfigError) as caught:
        _pairs(configs["config"], overrides)
    assert key in str(caught.value) and "\n" not in str(caught.value)


def test_the_stage_aligns_the_per_head_classes_it_declares(configs, repo_root):
    """The stage passes its section's classes (by default the per-head ones and the permutations), not
    attnid barrier's default (every class: the stream's and GL(D) would near the stage's job-time target)."""
    from attnid.edits.alignment import DEFAULT_CLASSES, PER_HEAD_CLASSES, parse_classes

    for name in ("config", "smoke"):
        config = copy.deepcopy(configs[name])
        plan(config, {})
        classes = config["alignment"]["classes"]
        assert parse_classes(",".join(classes)) == PER_HEAD_CLASSES != parse_classes(None) == DEFAULT_CLASSES
    config = copy.deepcopy(configs["config"])
    plan(config, {"alignment": {"classes": ["stream", "heads"]}})
    assert config["alignment"]["classes"] == ["stream", "heads"]
    with pytest.raises(ConfigError) as caught:
        plan(copy.deepcopy(configs["config"]), {"alignment": {"classes": ["sideways"]}})
    assert "alignment/classes" in str(caught.value)
    rule = (repo_root / "workflow" / "rules" / "alignment.smk").read_text()
    assert '",".join(ALIGNMENT_SECTION.get("classes")' in rule and "--classes {params.classes}" in rule
