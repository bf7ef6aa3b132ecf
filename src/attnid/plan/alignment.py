"""The alignment stage's pairs (docs/design.md §18, docs/experiments.md "The alignment stage"): every pair of
seeds of each case's runs and of each head-study point ``h<H>``, whose final checkpoints ``attnid barrier``
aligns and interpolates (its report holds what ``attnid compare`` reports too).

A config's ``alignment`` section (absent or null: no such stage) says which groups of runs are paired
(``studies``: ``cases``, ``heads``) and how the line is sampled (``points``, ``sequences``). A run that the
plan copies from an identical earlier run (:meth:`attnid.plan.runs.Plan.copied`) has no checkpoint of its
own: its pair reads the checkpoint of the run it copies. A group with one seed has no pair; a config with no
pair at all has no alignment jobs and no Figure 8.

``pairs_from`` (``{study: {group: seeds}}``) names the groups paired, and their seeds, instead of every
group of ``studies`` with its study's seeds: a seed its study does not train is trained for this stage
alone (:func:`alignment_runs`; the plan lays it out beside the study's own runs, where no other stage reads
it). The smoke build pairs one heads point so: two seeds of one group, the cheapest Figure 8.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from attnid.plan.studies import heads_points

STUDY_DIRS = {"cases": "runs", "heads": "studies/heads"}  # where each group's runs are, below results_dir


@dataclass(frozen=True)
class AlignmentPair:
    """Two runs of one group (a case or a head-study point) that differ only in their seed."""

    study: str  # cases or heads
    group: str  # the case or the point (h<H>)
    seed_a: int
    seed_b: int
    run_a: str  # the run directory whose ckpt.pt is A (the copied run's source where it is a copy)
    run_b: str

    @property
    def name(self) -> str:
        return f"{self.study}/{self.group}/seed{self.seed_a}-seed{self.seed_b}"


def alignment_settings(config: dict) -> dict | None:
    """The section (its defaults filled in by the schema, config.schema.yaml); None without the stage."""
    return config.get("alignment") or None


def _heads_groups(config: dict) -> list[str]:
    """The heads study's points that the stage pairs: ``h<H>`` for H in ``n_heads`` (not the matched single
    head); none where the study is off."""
    if not config.get("heads"):
        return []
    points = [p.name for p in heads_points(config["model"], config["heads"])]
    wanted = [f"h{n}" for n in config["heads"]["n_heads"]]
    return [name for name in points if name in wanted]


def check_alignment_config(config: dict) -> list[tuple[str, str]]:
    """``(key, problem)`` of the section beyond its schema: each group of ``pairs_from`` is one the build
    has (a configured case, a point of the heads study), of a study the section pairs. A study of
    ``studies`` that the config turns off (``--config heads=null``) has no pair, as a group with one seed
    has none, ``pairs_from``'s groups of it included: the stage pairs what the build trains."""
    section = alignment_settings(config)
    if section is None:
        return []
    problems = []
    known = {"cases": list(config["cases"]), "heads": _heads_groups(config)}
    for study, groups in (section.get("pairs_from") or {}).items():
        if study not in section["studies"]:
            problems.append((f"alignment/pairs_from/{study}", f"{study} is not among alignment/studies"))
            continue
        for group in groups:
            if group not in known[study]:
                where = "the configured cases" if study == "cases" else "the heads study's points h<H>"
                if study == "heads" and not config.get("heads"):
                    continue  # the study is off (``--config heads=null``): its groups have no pair
                problems.append(
                    (f"alignment/pairs_from/{study}/{group}", f"no '{group}' among {where}: {known[study]}")
                )
    return problems


def _groups(config: dict) -> list[tuple[str, str, list[int]]]:
    """``(study, group, seeds)`` of every group the section pairs."""
    section = alignment_settings(config)
    if section is None:
        return []
    if section.get("pairs_from"):
        return [
            (study, group, list(seeds))
            for study, groups in section["pairs_from"].items()
            if study != "heads" or config.get("heads")  # a study turned off has no pair, as above
            for group, seeds in groups.items()
        ]
    groups = []
    if "cases" in section["studies"]:
        groups += [("cases", case, list(config["seeds"])) for case in config["cases"]]
    if "heads" in section["studies"]:
        groups += [("heads", name, list(config["heads"]["seeds"])) for name in _heads_groups(config)]
    return groups


def alignment_runs(config: dict, results_dir: str) -> list[tuple[str, str, str, int]]:
    """``(run directory, study, group, seed)`` of every run a pair reads, in the section's order: the plan
    trains those its study does not (``pairs_from``'s other seeds), for this stage alone."""
    return [
        (f"{results_dir}/{STUDY_DIRS[study]}/{group}/seed{seed}", study, group, seed)
        for study, group, seeds in _groups(config)
        for seed in seeds
    ]


def alignment_pairs(config: dict, plan: Any) -> list[AlignmentPair]:
    """Every pair of seeds (in the config's order) of every group the section pairs, each run read where
    its checkpoint is (a copied run: its source). ``plan``: the config's :class:`attnid.plan.runs.Plan`
    (not imported: runs.py reads the config through config.py, which checks this section)."""
    pairs = []
    for study, group, seeds in _groups(config):
        for seed_a, seed_b in itertools.combinations(seeds, 2):
            runs = []
            for seed in (seed_a, seed_b):
                run_dir = f"{plan.results_dir}/{STUDY_DIRS[study]}/{group}/seed{seed}"
                spec = plan.runs[run_dir]
                runs.append(spec.copied_from or run_dir)
            pairs.append(AlignmentPair(study, group, seed_a, seed_b, runs[0], runs[1]))
    return pairs
