"""The quantization stage's table and claims (docs/quantization.md, docs/design.md §16): ``attnid
quant-report --orbit-points`` reports gathered into ``quantization.csv`` (one row per model, orbit point and
setting), ``quantization_seeds.csv`` (the R1 seed study), ``quantization_activations.csv`` (one row per model,
orbit point, site and layer: the kurtosis and max/rms of that linear layer's inputs, what Figure 7 (a) draws)
and ``quantization.tex``; the claims of
``QUANTIZATION_CLAIMS`` are read from them by ``attnid tables``.

Claims (the issue's targets; each the worst over the models it is about):

- every orbit point keeps the function: the float loss of every point equals the shipped model's (float32);
- the R1 picked on calibration text against the median seed on held-out text (``pick_setting``);
- attnid's optimized output-value move against a random ``R2`` (QuaRot's randomized Hadamard) on the
  int4 V cache;
- SmolLM2 (where the stage ran on it): 4-bit activations at q/k/v/gate/up after ``R1`` against the shipped
  model, the int4 V cache after the optimized move against the shipped model.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from attnid.common.errors import UserError
from attnid.common.files import read_json, write_csv_atomic, write_text_atomic
from attnid.reports.latex import render_table

SMOLLM2 = "smollm2"
REPORT_KEYS = ("rows", "points", "activations")  # what an --orbit-points report holds (and "seeds")
ACTIVATION_COLUMNS = ["model", "point", "site", "layer", "kurtosis", "max_over_rms"]
SHIPPED, R1, R1_PICKED = "shipped", "R1 random", "R1 picked"
R2_RANDOM, OV_OPTIMIZED = "R1+R2 random", "R1+OV optimized"
# thresholds of the claims (the targets)
FLOAT_LOSS_CHANGE_MAX = 1e-4  # |loss(point) - loss(shipped)|, float32
EXACT_DLOGP_MAX = 1e-10  # the moves' own change of log p, float64 (the census's forward)
SEED_PICK_RATIO_MIN = 2.0  # median seed's held-out KL over the picked seed's
OV_OVER_R2_RATIO_MIN = 1.25  # random R2's V4 KL over the optimized move's: at least 20 % below
ACTIVATION_RATIO_MIN = 4.0  # SmolLM2: shipped A4 (q/k/v/gate/up) KL over R1's
V_CACHE_RATIO_MIN = 2.0  # SmolLM2: shipped V4 KL over the optimized move's
# the activation sites of quant-report (attnid.edits.quant_eval.SITES), as Figure 7 names them
SITE_NAMES = {
    "qkv": "q/k/v inputs",
    "o": "output proj. inputs",
    "up": "MLP inputs",
    "down": "down proj. inputs",
}
ROTATED_SITES = ("qkv", "up")  # the inputs R1 rotates (read from the residual stream through a norm)
GAUSSIAN_KURTOSIS = 3.0  # Pearson's kurtosis of a Gaussian
# a linear input with a larger kurtosis has outlier channels for a rotation to spread (SmolLM2's shipped
# q/k/v inputs: 412; a Laplace distribution's is 6)
OUTLIER_KURTOSIS = 10.0

# the stage's claims in claims.csv (:func:`attnid.reports.claims.quantization_claims`): (key of
# claim_values, claim, relation, threshold, precision)
QUANTIZATION_CLAIMS = (
    (
        "float",
        f"quantization: every orbit point keeps the loss (< {FLOAT_LOSS_CHANGE_MAX:g})",
        "<",
        FLOAT_LOSS_CHANGE_MAX,
        "float32",
    ),
    (
        "exact",
        f"quantization: moves exact in float64 (|dlogp| < {EXACT_DLOGP_MAX:g})",
        "<",
        EXACT_DLOGP_MAX,
        "float64",
    ),
    (
        "seeds",
        f"quantization: R1 picked on calibration >= {SEED_PICK_RATIO_MIN:g}x better than the median seed",
        ">",
        SEED_PICK_RATIO_MIN,
        "float32",
    ),
    (
        "ov",
        "quantization: optimized OV move V4 KL >= 20 % below random R2",
        ">",
        OV_OVER_R2_RATIO_MIN,
        "float32",
    ),
    (
        "smollm2_activations",
        f"quantization: SmolLM2 A4 q/k/v/gate/up KL >= {ACTIVATION_RATIO_MIN:g}x below shipped",
        ">",
        ACTIVATION_RATIO_MIN,
        "float32",
    ),
    (
        "smollm2_v_cache",
        f"quantization: SmolLM2 V4 KL >= {V_CACHE_RATIO_MIN:g}x below shipped",
        ">",
        V_CACHE_RATIO_MIN,
        "float32",
    ),
    (
        "smollm2_ov",
        "quantization: SmolLM2 optimized OV move V4 KL >= 20 % below random R2",
        ">",
        OV_OVER_R2_RATIO_MIN,
        "float32",
    ),
    (
        "smollm2_seeds",
        f"quantization: SmolLM2 R1 picked >= {SEED_PICK_RATIO_MIN:g}x better than the median seed",
        ">",
        SEED_PICK_RATIO_MIN,
        "float32",
    ),
)
# the keys of the claims that check exactness (claims.csv's kind ``check``); the others are the stage's
# hypotheses, findings (``finding``: :mod:`attnid.reports.claim_kinds`), and their texts
QUANTIZATION_CHECKS = frozenset({"float", "exact"})
QUANTIZATION_FINDINGS = frozenset(
    claim for key, claim, *_ in QUANTIZATION_CLAIMS if key not in QUANTIZATION_CHECKS
)


def model_label(path: Path) -> str:
    """``smollm2``, or ``<case>/seed<N>`` of a build checkpoint's report
    (``quantization/<case>/seedN.json``)."""
    return SMOLLM2 if path.stem == SMOLLM2 else f"{path.parent.name}/{path.stem}"


def gather(paths: list[Path]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``(rows, seeds, activations)``: every report's rows (``model``, ``point``, ``setting``, ``kl``,
    ``kl_max``, ``loss``, ``ppl``, the point's ``exact_max_abs_dlogp``), every seed of its seed study, and
    its activation rows (:data:`ACTIVATION_COLUMNS`)."""
    rows, seeds, activations = [], [], []
    for path in paths:
        report = read_json(path, "quant-report")
        missing = [key for key in REPORT_KEYS if not isinstance(report, dict) or key not in report]
        if missing:
            raise UserError(
                f"{path} is not a report of attnid quant-report --orbit-points (no {', '.join(missing)})"
            )
        model = model_label(Path(path))
        exact = {name: point.get("exact_max_abs_dlogp", math.nan) for name, point in report["points"].items()}
        for row in report["rows"]:
            rows.append({"model": model, **row, "exact_max_abs_dlogp": exact.get(row["point"], math.nan)})
        activations += [{"model": model, **row} for row in report["activations"]]
        study = report.get("seeds") or {"per_seed": []}
        for row in study["per_seed"]:
            seeds.append(
                {
                    "model": model,
                    "setting": study["setting"],
                    **row,
                    "picked": row["seed"] == study["picked_seed"],
                }
            )
    return pd.DataFrame(rows), pd.DataFrame(seeds), pd.DataFrame(activations, columns=ACTIVATION_COLUMNS)


def largest_kurtosis(
    activations: pd.DataFrame, point: str | None = None, sites: tuple[str, ...] = ROTATED_SITES
) -> float:
    """The largest kurtosis of ``activations`` (``quantization_activations.csv``'s rows) at ``sites``, at the
    orbit point ``point`` (None: at every point); NaN where there is none."""
    mine = activations[activations["site"].isin(sites)]
    if point is not None:
        mine = mine[mine["point"] == point]
    return float(mine["kurtosis"].max()) if len(mine) else math.nan


def _kl(rows: pd.DataFrame, model: str, point: str, setting: str) -> float:
    hit = rows[(rows["model"] == model) & (rows["point"] == point) & (rows["setting"] == setting)]
    return float(hit["kl"].iloc[0]) if len(hit) else math.nan


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else math.nan


def seed_pick_ratio(seeds: pd.DataFrame, model: str) -> float:
    """The median seed's held-out KL over the picked seed's (the seed with the least calibration KL)."""
    mine = seeds[seeds["model"] == model] if "model" in seeds else seeds
    if mine.empty:
        return math.nan
    picked = float(mine[mine["picked"].astype(bool)]["evaluation_kl"].iloc[0])
    return _ratio(float(mine["evaluation_kl"].median()), picked)


def claim_values(rows: pd.DataFrame, seeds: pd.DataFrame) -> dict[str, tuple[float, str]]:
    """``{claim key: (measured, detail)}`` of :func:`quantization_claims`."""
    models = sorted(rows["model"].unique())
    build = [model for model in models if model != SMOLLM2]
    floats = rows[rows["setting"] == "float"]
    shift = floats.groupby("model")["loss"].agg(lambda x: float(x.max() - x.min()))
    values = {
        "float": (
            float(shift.max()),
            f"largest spread of the float loss over the orbit points, {len(models)} models",
        ),
        "exact": (
            float(pd.to_numeric(rows["exact_max_abs_dlogp"], errors="coerce").max()),
            "largest max |delta log p| of the moves, float64 (the census's forward), every point and model",
        ),
    }
    if build:
        values["seeds"] = (
            min(seed_pick_ratio(seeds, model) for model in build),
            f"smallest median-seed / picked-seed held-out KL over {len(build)} build checkpoints "
            f"({seeds['setting'].iloc[0] if len(seeds) else '?'})",
        )
        values["ov"] = (
            min(_ratio(_kl(rows, m, R2_RANDOM, "V4"), _kl(rows, m, OV_OPTIMIZED, "V4")) for m in build),
            f"smallest V4 KL of a random R2 over the optimized move's, {len(build)} build checkpoints",
        )
    if SMOLLM2 in models:
        values["smollm2_activations"] = (
            _ratio(_kl(rows, SMOLLM2, SHIPPED, "A4:qkv+up"), _kl(rows, SMOLLM2, R1_PICKED, "A4:qkv+up")),
            "SmolLM2: shipped KL over R1's (picked) with 4-bit q/k/v/gate/up inputs, held-out text",
        )
        values["smollm2_v_cache"] = (
            _ratio(_kl(rows, SMOLLM2, SHIPPED, "V4"), _kl(rows, SMOLLM2, OV_OPTIMIZED, "V4")),
            "SmolLM2: shipped int4 V-cache KL over the optimized output-value move's",
        )
        values["smollm2_ov"] = (
            _ratio(_kl(rows, SMOLLM2, R2_RANDOM, "V4"), _kl(rows, SMOLLM2, OV_OPTIMIZED, "V4")),
            "SmolLM2: a random R2's int4 V-cache KL over the optimized output-value move's",
        )
        values["smollm2_seeds"] = (
            seed_pick_ratio(seeds, SMOLLM2),
            "SmolLM2: median-seed / picked-seed held-out KL of R1",
        )
    return values


def write_quantization_tables(paths: list[Path], out_dir: Path) -> dict[str, pd.DataFrame]:
    """``quantization.csv``, ``quantization_seeds.csv``, ``quantization_activations.csv`` and
    ``quantization.tex`` in ``out_dir``."""
    rows, seeds, activations = gather(paths)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(out_dir / "quantization.csv", rows)
    write_csv_atomic(out_dir / "quantization_seeds.csv", seeds)
    write_csv_atomic(out_dir / "quantization_activations.csv", activations)
    quantized = rows[rows["setting"] != "float"]
    settings = list(dict.fromkeys(quantized["setting"]))
    wide = quantized.pivot_table(index=["model", "point"], columns="setting", values="kl", sort=False)
    text = render_table("quantization.tex.j2", wide.reset_index(), settings=settings)
    write_text_atomic(out_dir / "quantization.tex", text)
    return {"quantization": rows, "quantization_seeds": seeds, "quantization_activations": activations}
