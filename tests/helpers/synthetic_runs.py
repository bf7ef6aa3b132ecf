"""Synthetic run directories (run.json + metrics.csv with attnid train's columns), for the
table and figure tests: numbers chosen so the expected summaries are known exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from attnid.cli import main


def write_run(
    run_dir: Path,
    case: str,
    seed: int,
    lr: float,
    *,
    steps: int = 40,
    log_every: int = 10,
    rho_qk: float = 1e-9,
    rho_ov: float = 1e-9,
    final_beta: float = 1e-3,
    tau: float = 1e-7,
    mu: float = 0.1,
    final_val_loss: float = 2.0,
    status: str = "completed",
    rebalance_every: int = 0,
    weight_decay: float = 0.0,
    dtype: str = "float64",
    drift1: float = 1e-18,
    drift2: float | None = None,
    closure: float = 1e-16,
    drift1_pred_relerr: float | None = None,
) -> Path:
    """One run: β grows linearly to ``final_beta`` (and drops to 1e-9 on rebalance rows), ρ constant,
    the drift split grows linearly to ``drift1`` and ``drift2`` (default: ``final_beta``; OV twice QK),
    the closure constant, a diverged run's last row is NaN."""
    run_dir.mkdir(parents=True, exist_ok=True)
    step = np.arange(0, steps + 1, log_every)
    beta = final_beta * step / steps
    rebalanced = np.zeros_like(step)
    if rebalance_every:
        rebalanced = ((step % rebalance_every == 0) & (step > 0)).astype(int)
        beta = np.where(rebalanced == 1, 1e-9, beta)
    frame = pd.DataFrame(
        {
            "step": step,
            "lr": lr,
            "train_loss": 3.0 - step / steps,
            "eval_train_loss": np.nan,
            "val_loss": np.where(step % 20 == 0, final_val_loss + (steps - step) / steps, np.nan),
            "rho_qk": np.where(step > 0, rho_qk, np.nan),
            "rho_ov": np.where(step > 0, rho_ov, np.nan),
            "beta_qk": beta,
            "beta_ov": 2 * beta,
            "tau": tau,
            "tau_logits": 3 * tau,
            "mu_qk": mu,
            "mu_ov": 2 * mu,
            "grad_norm": 1.0,
            "tokens_per_s": 1000.0,
            "wall_s": step / 10.0,
            "rebalanced": rebalanced,
            "skipped_pairs": 0,
            "drift1_qk": drift1 * step / steps,
            "drift1_ov": 2 * drift1 * step / steps,
            "drift2_qk": (final_beta if drift2 is None else drift2) * step / steps,
            "drift2_ov": 2 * (final_beta if drift2 is None else drift2) * step / steps,
            "closure_qk": closure,
            "closure_ov": closure,
        }
    )
    if drift1_pred_relerr is not None:
        frame["drift1_pred_qk"] = frame["drift1_qk"]
        frame["drift1_pred_relerr_qk"] = frame["drift1_pred_relerr_ov"] = drift1_pred_relerr
    diverged_step = None
    if status == "diverged":
        frame.loc[frame.index[-1], ["train_loss", "val_loss", "rho_qk", "rho_ov", "beta_qk", "beta_ov"]] = (
            np.nan
        )
        diverged_step = int(step[-1])
    frame.to_csv(run_dir / "metrics.csv", index=False)
    summary = {
        "status": status,
        "case": case,
        "lr": lr,
        "seed": seed,
        "steps_completed": int(step[-1]),
        "diverged_step": diverged_step,
        "final_train_loss": None if status == "diverged" else final_val_loss - 0.1,
        "final_val_loss": None if status == "diverged" else final_val_loss,
        "final_val_loss_full": None if status == "diverged" else final_val_loss,
        "wall_time_s": 4.0,
        "device": "cpu",
        "dtype": dtype,
        "initial_imbalance_scale": {"qk": 0.5, "ov": 0.7},
        "config": {
            "case": case,
            "lr": lr,
            "seed": seed,
            "max_iters": steps,
            "weight_decay": weight_decay,
            "warmup_iters": 0,
            "lr_decay_iters": steps,
            "min_lr": lr,
            "rebalance_every": rebalance_every,
        },
    }
    (run_dir / "run.json").write_text(json.dumps(summary))
    return run_dir


def write_study(root: Path, sgd_dtype: str = "float64") -> tuple[Path, Path]:
    """A small study under ``root``: runs/<case>/seed<S> (3 seeds of sgd, adamw, adamw_rebalance,
    sgd_wd) and sweep/<opt>/lr<lr>/seed0 with β_QK = 0.5 lr² (β_OV = lr²) for SGD, 0.3 lr for AdamW, and one
    diverged SGD point. The sgd and sgd_wd runs and the SGD sweep train in ``sgd_dtype``, the AdamW
    cases in float32. Returns (runs_dir, sweep_dir)."""
    runs, sweep = root / "runs", root / "sweep"
    for seed in range(3):
        write_run(
            runs / "sgd" / f"seed{seed}",
            "sgd",
            seed,
            0.5,
            rho_qk=1e-27 * (seed + 1),
            rho_ov=1e-28,
            final_val_loss=1.0 + seed,
            drift1=1e-17 * (seed + 1),
            drift2=1e-3,
            dtype=sgd_dtype,
        )
        write_run(
            runs / "sgd_wd" / f"seed{seed}",
            "sgd_wd",
            seed,
            0.5,
            rho_qk=0.2,
            final_beta=0.4,
            weight_decay=0.1,
            drift1=0.4,
            drift2=0.01,
            drift1_pred_relerr=1e-12 * (seed + 1),
            dtype=sgd_dtype,
        )
        write_run(
            runs / "adamw" / f"seed{seed}",
            "adamw",
            seed,
            1e-3,
            rho_qk=0.05 + 0.01 * seed,
            final_beta=0.2,
            drift1=0.2 + 0.1 * seed,
            drift2=0.01,
            dtype="float32",
        )
        write_run(
            runs / "adamw_rebalance" / f"seed{seed}",
            "adamw_rebalance",
            seed,
            1e-3,
            rho_qk=0.06,
            final_beta=0.2,
            rebalance_every=20,
            drift1=0.2,
            drift2=0.01,
            dtype="float32",
        )
    for lr in (0.01, 0.1, 1.0):
        write_run(
            sweep / "sgd" / f"lr{lr:g}" / "seed0",
            "sgd",
            0,
            lr,
            final_beta=0.5 * lr**2,
            rho_qk=1e-27,
            rho_ov=1e-27,
            dtype=sgd_dtype,
        )
        write_run(
            sweep / "adamw" / f"lr{lr / 100:g}" / "seed0",
            "adamw",
            0,
            lr / 100,
            rho_qk=0.05,
            final_beta=0.3 * lr / 100,
            drift1=0.3 * lr / 100,
            drift2=0.01 * lr / 100,
            dtype="float32",
        )
    write_run(sweep / "sgd" / "lr1000" / "seed0", "sgd", 0, 1000.0, status="diverged", dtype=sgd_dtype)
    return runs, sweep


# The interventions' arms as attnid train names them (attnid.plan.interventions.arm_name): arm -> (case,
# lr, what its run.json's config adds). The lr arm names itself (--arm).
INTERVENTION_ARMS = {
    "adamw": ("adamw", 1e-3, {}),
    "adamw_gauge_fixed": ("adamw_gauge_fixed", 1e-3, {}),
    "adamw_gauge_fixed_at_init": ("adamw_gauge_fixed", 1e-3, {"initial_point": "init"}),
    "adamw_from_gauge_point": ("adamw", 1e-3, {"initial_point": "gauge"}),
    "adamw_lr2x": ("adamw", 2e-3, {"arm": "adamw_lr2x"}),
    "adamw_projected": ("adamw_projected", 1e-3, {}),
    "adamw_frozen_mlp": ("adamw", 1e-3, {"freeze_mlp": True}),
    "adamw_rebalance": ("adamw_rebalance", 1e-3, {}),
    "adamw_rebalance_first_moment": ("adamw_rebalance", 1e-3, {"rebalance_moments": "first-moment"}),
}


def write_intervention_runs(
    root: Path, final_losses: dict[str, list[float]], identity: bool = True
) -> tuple[list[str], list[str]]:
    """Runs of the interventions under ``root``/<arm>/seed<S>: per arm of :data:`INTERVENTION_ARMS`, its
    final loss on the whole val split for seeds 0, 1, ... (``final_losses``); ``adamw``'s ρ is 0.05 and the
    projected arm's 1e-12 (float32 round-off); with ``identity``, a float64 identity run of the projected
    arm at 1e-29. Returns (the arms' run directories, the identity run's)."""
    dirs = []
    for arm, losses in final_losses.items():
        case, lr, config = INTERVENTION_ARMS[arm]
        projected = case == "adamw_projected"
        for seed, loss in enumerate(losses):
            run_dir = write_run(
                root / arm / f"seed{seed}",
                case,
                seed,
                lr,
                final_val_loss=loss,
                dtype="float32",
                rho_qk=1e-12 if projected else 0.05,
                rho_ov=1e-12 if projected else 0.07,
                drift1=1e-8 if projected else 0.2,
                drift2=1e-3,
                rebalance_every=20 if case == "adamw_rebalance" else 0,
            )
            info = json.loads((run_dir / "run.json").read_text())
            info["config"].update(config)
            (run_dir / "run.json").write_text(json.dumps(info))
            dirs.append(str(run_dir))
    identity_dirs = []
    if identity:
        identity_dirs.append(
            str(
                write_run(
                    root / "identity" / "seed0",
                    "adamw_projected",
                    0,
                    1e-3,
                    rho_qk=1e-29,
                    rho_ov=1e-29,
                    drift1=1e-17,
                    drift2=1e-4,
                    dtype="float64",
                )
            )
        )
    return dirs, identity_dirs


def write_theory_tables(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The three theory CSVs of `attnid counts` and a tiny `attnid verify`-shaped nullity table."""
    theory = tmp_path / "theory"
    assert (
        main(
            [
                "counts",
                "--out",
                str(theory / "counts.csv"),
                "--single-head-out",
                str(theory / "single_head.csv"),
            ]
        )
        == 0
    )
    pd.DataFrame(
        {
            "case": ["h1"],
            "kind": ["attention"],
            "n_params": [576],
            "n_outputs": [600],
            "theory": [288],
            "measured": [288],
            "gap": [1e12],
            "passed": [True],
        }
    ).to_csv(theory / "nullity.csv", index=False)
    return theory / "counts.csv", theory / "nullity.csv", theory / "single_head.csv"


# Effects (mean, spread) of the interventions' arms on adamw's final loss, for tables and Figure 6
DEFAULT_EFFECTS = {
    "adamw_gauge_fixed": (-0.012, 0.003),  # (mean, spread): better on every seed
    "adamw_gauge_fixed_at_init": (0.0005, 0.002),  # equivalent within +-0.01
    "adamw_from_gauge_point": (-0.011, 0.003),  # better
    "adamw_lr2x": (-0.006, 0.03),  # either sign, past the margin: inconclusive
}
PAPER_EFFECTS = DEFAULT_EFFECTS | {
    "adamw_projected": (0.001, 0.002),
    "adamw_frozen_mlp": (0.02, 0.004),  # worse
    "adamw_rebalance": (0.002, 0.003),
    "adamw_rebalance_first_moment": (0.004, 0.003),
}
SMOKE_EFFECTS = {  # the smoke config's arms: nothing is decided at 2 seeds, however clear
    "adamw_projected": (0.0001, 0.0002),
    "adamw_gauge_fixed": (-0.003, 0.001),
    "adamw_rebalance": (0.00004, 0.00002),
    "adamw_rebalance_first_moment": (0.00009, 0.00003),
}


def final_losses(effects: dict[str, tuple[float, float]], n_seeds: int) -> dict[str, list[float]]:
    """adamw's final loss per seed and each arm's: adamw's plus its effect, spread evenly (both signs)."""
    base = [2.3 + 0.02 * seed for seed in range(n_seeds)]
    spread = np.sin(1.7 * np.arange(n_seeds) + 0.4)  # a fixed pattern of both signs
    losses = {"adamw": base}
    for i, (arm, (mean, width)) in enumerate(effects.items()):
        pattern = np.roll(spread, i) - np.roll(spread, i).mean()
        losses[arm] = [b + mean + width * p for b, p in zip(base, pattern)]
    return losses


# The stage's protocol at each arm's own best lr (docs/design.md §6, §11.3): the calibration's grid, each
# arm's chosen lr there (adamw_frozen_mlp's at the grid's top edge), and effects at those lrs.
CALIBRATION_LRS = (0.0025, 0.005, 0.01, 0.02, 0.04)
BEST_LRS = {
    "adamw": 0.02,
    "adamw_gauge_fixed": 0.01,
    "adamw_gauge_fixed_at_init": 0.02,
    "adamw_from_gauge_point": 0.01,
    "adamw_frozen_mlp": 0.04,
}
BEST_LR_EFFECTS = {
    "adamw_gauge_fixed": (0.006, 0.003),
    "adamw_gauge_fixed_at_init": (0.005, 0.002),
    "adamw_from_gauge_point": (-0.001, 0.003),
    "adamw_frozen_mlp": (0.02, 0.004),
}
METRIC_COLUMNS = (
    "rho_",
    "beta_",
    "tau",
    "mu_",
    "drift",
    "closure_",
)  # what a run with metrics off leaves empty


def write_best_lr_runs(
    root: Path, final_losses: dict[str, list[float]], steps: int = 40, full_val_every: int = 10
) -> list[str]:
    """The arms at their best lr (``<arm>_best_lr``, named by ``--arm``, at :data:`BEST_LRS`), trained with
    the metrics off (their ρ, β, drift columns empty, as attnid train leaves them) and evaluated on the whole
    val split every ``full_val_every`` steps (``val_loss_full``): adamw's loss of that seed plus 0.5 at step
    0, falling to the run's final loss at the end, the arm's difference from adamw growing linearly with
    the step from 0. Returns the run directories."""
    dirs = []
    base = final_losses["adamw"]
    for arm, losses in final_losses.items():
        case, _, config = INTERVENTION_ARMS[arm]
        for seed, loss in enumerate(losses):
            run_dir = write_run(
                root / f"{arm}_best_lr" / f"seed{seed}",
                case,
                seed,
                BEST_LRS[arm],
                steps=steps,
                log_every=full_val_every,
                final_val_loss=loss,
                dtype="float32",
            )
            metrics = pd.read_csv(run_dir / "metrics.csv")
            for column in metrics.columns:
                if column.startswith(METRIC_COLUMNS):
                    metrics[column] = np.nan
            fraction = metrics["step"] / steps
            metrics["val_loss_full"] = base[seed] + 0.5 * (1 - fraction) + (loss - base[seed]) * fraction
            metrics.to_csv(run_dir / "metrics.csv", index=False)
            info = json.loads((run_dir / "run.json").read_text())
            info["config"].update(config | {"arm": f"{arm}_best_lr"})
            (run_dir / "run.json").write_text(json.dumps(info))
            dirs.append(str(run_dir))
    return dirs


def calibration_infos(
    seeds: tuple[int, ...] = (100, 101), diverged: tuple[str, float] | None = None
) -> list[dict]:
    """run.json of each calibration run of the arms of :data:`BEST_LRS` over :data:`CALIBRATION_LRS`: a
    final loss 2.4 + 0.1 (log2(lr / best))² + 0.01 seed, lowest at the arm's best lr; ``diverged``: (arm,
    lr) of a run that diverged (its lr then has no mean)."""
    infos = []
    for arm, best in BEST_LRS.items():
        case, _, config = INTERVENTION_ARMS[arm]
        for lr in CALIBRATION_LRS:
            for seed in seeds:
                failed = diverged == (arm, lr) and seed == seeds[0]
                loss = 2.4 + 0.1 * np.log2(lr / best) ** 2 + 0.01 * (seed - seeds[0])
                infos.append(
                    {
                        "case": case,
                        "lr": lr,
                        "seed": seed,
                        "status": "diverged" if failed else "completed",
                        "final_val_loss_full": None if failed else float(loss),
                        "config": {"case": case, "lr": lr, "seed": seed} | config,
                    }
                )
    return infos
