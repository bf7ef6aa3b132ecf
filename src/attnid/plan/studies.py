"""Does identification buy anything? The heads and variants studies' points (docs/experiments.md).

The paper closes on a hypothesis it never tests: more heads, GQA and RoPE make attention "more
identified" (a larger closed-form identified fraction, ``attnid.theory.counts``), and that may be why they
improved transformers. Two studies train AdamW (the ``adamw`` case's settings) on the same data and
token budget per point:

* ``heads``: ``H`` heads at the config's embedding ``E`` (``D = E/H``), plus the identification-matched
  single head of the paper's §4.10: ``H = 1`` at ``E_0 = E sqrt(2 - 1/H_ref)`` rounded to an even
  integer (:func:`matched_single_head_embd`, docs/design.md §10);
* ``variants``: at the config's ``H``, MHA, GQA (``n_kv_head``) and RoPE, alone and together.

Each point is one training run per seed under ``<results_dir>/studies/<study>/<point>/seed<N>/``
(:func:`attnid.plan.runs.plan`); :mod:`attnid.reports.studies` gathers them into the tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnid.theory.counts import layer_shape, single_head_match_equal_identified

STUDIES = ("heads", "variants")
# Every study point trains with the AdamW case's settings (lr, weight decay).
STUDY_CASE = "adamw"
# Keys of a study section that are the study's own grid, not settings of its runs.
STUDY_GRID_KEYS = ("n_heads", "matched_reference_heads", "points", "seeds")


@dataclass(frozen=True)
class StudyPoint:
    """One architecture of a study: its directory name and the attention shape its runs train."""

    study: str
    name: str
    n_embd: int
    n_head: int
    n_kv_head: int
    head_dim: int | None  # None: E/H, when H divides E
    rope: bool

    def architecture(self) -> dict:
        return {
            "n_head": self.n_head,
            "n_embd": self.n_embd,
            "head_dim": self.head_dim,
            "n_kv_head": self.n_kv_head,
            "rope": self.rope,
        }


def matched_single_head_embd(n_embd: int, reference_heads: int) -> int:
    """``E_0`` of the single head matched to an ``H_ref``-head layer of width ``E`` (§4.10, T6):
    ``E sqrt(2 - 1/H_ref)`` (equal identified counts,
    :func:`attnid.theory.counts.single_head_match_equal_identified`, docs/design.md §10), rounded to the
    nearest even integer (170 for ``E = 128``, ``H_ref = 4``)."""
    return 2 * math.floor(single_head_match_equal_identified(n_embd, reference_heads) / 2 + 0.5)


def heads_points(model: dict, heads: dict) -> list[StudyPoint]:
    """``h<H>`` for every ``H`` of ``heads.n_heads`` at ``model.n_embd``, then ``h1_e<E_0>``, the
    matched single head, when ``heads.matched_reference_heads`` is set."""
    n_embd = int(model["n_embd"])
    points = []
    for n_head in heads["n_heads"]:
        head_dim = n_embd // n_head if n_embd % n_head == 0 else None
        points.append(StudyPoint("heads", f"h{n_head}", n_embd, n_head, n_head, head_dim, False))
    reference = heads.get("matched_reference_heads")
    if reference:
        e0 = matched_single_head_embd(n_embd, int(reference))
        points.append(StudyPoint("heads", f"h1_e{e0}", e0, 1, 1, e0, False))
    return points


def variants_points(model: dict, variants: dict) -> list[StudyPoint]:
    """One point per entry of ``variants.points`` (name -> ``{n_kv_head, rope}``) at the model's ``H``
    and ``E``."""
    n_embd, n_head = int(model["n_embd"]), int(model["n_head"])
    head_dim = n_embd // n_head if n_embd % n_head == 0 else None
    return [
        StudyPoint(
            "variants",
            name,
            n_embd,
            n_head,
            int((spec or {}).get("n_kv_head", n_head)),
            head_dim,
            bool((spec or {}).get("rope", False)),
        )
        for name, spec in variants["points"].items()
    ]


def study_points(config: dict) -> dict[str, list[StudyPoint]]:
    """{study: its points} for the study sections a pipeline config has (``heads``, ``variants``: each
    optional, a config without them trains no study)."""
    planners = {"heads": heads_points, "variants": variants_points}
    return {study: planners[study](config["model"], config[study]) for study in STUDIES if config.get(study)}


def study_run_settings(section: dict) -> dict:
    """The settings a study section gives all its points' runs (max_iters, log_every, ...)."""
    return {key: value for key, value in section.items() if key not in STUDY_GRID_KEYS}


def check_study_config(config: dict) -> list[tuple[str, str]]:
    """Problems of the study sections the schema cannot see (shapes the model or counts.py reject):
    (key, problem)."""
    problems = []
    for study, points in study_points(config).items():
        for point in points:
            key = f"{study}/{point.name}"
            if point.head_dim is None:
                problems.append((key, f"n_head {point.n_head} does not divide model/n_embd {point.n_embd}"))
                continue
            try:
                layer_shape(point.n_embd, point.n_head, point.n_kv_head, point.head_dim, rope=point.rope)
            except ValueError as err:
                problems.append((key, str(err)))
    return problems
