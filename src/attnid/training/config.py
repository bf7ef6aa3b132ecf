"""The options of ``attnid train``: one dataclass drives the flags, the ``--config`` file and validation.

Each field of :class:`TrainConfig` carries its type (the annotation, read with
:func:`typing.get_type_hints`) and its metadata: ``help`` (``None`` hides a test
hook from ``--help``), ``metavar``, ``bound`` (``positive`` or ``non_negative``, both
finite), ``maximum`` and ``below`` (inclusive and exclusive upper limits; a size limit says why in a
comment: a size that would otherwise hang or exhaust the machine before any memory check could see it),
``choices`` (the values a text option takes) and ``resume`` (False for keys that may differ between a
checkpoint and the command that resumes it). Adding an option is adding one field: the flag, the
``--config`` key and the pipeline config's schema (:mod:`attnid.plan.schema`) follow.
"""

from __future__ import annotations

import functools
import math
import os
import re
import reprlib
import types
import typing
from dataclasses import dataclass, field, fields

from attnid.common.errors import UserError
from attnid.common.files import read_yaml
from attnid.common.limits import SEED_MAXIMUM, THREADS_MAXIMUM
from attnid.measure.options import METRICS_DEVICES
from attnid.model.gauge_fit import check_gauge_layout
from attnid.model.options import GAUGE_POINT, INITIAL_POINTS, INITIAL_VALUES, REBALANCE_TARGETS
from attnid.theory.shape import LayerShape
from attnid.training import cases
from attnid.training.options import DEVICES, DTYPES, REBALANCE_MOMENTS, RETIRED_MOMENTS

# An arm's name (--arm): it names a results folder and a row of the interventions table
ARM_NAME = re.compile(r"[a-z][a-z0-9_]*")
# Options that were replaced: each gives one line that says what to use instead
REPLACED_OPTIONS = {
    "reset_optimizer_state": "--reset-optimizer-state was replaced by --rebalance-moments reset "
    "(config key rebalance_moments: reset)",
}


def option(
    default: typing.Any,
    help: str | None,
    *,
    metavar: str | None = None,
    bound: str | None = None,
    maximum: int | float | None = None,
    below: float | None = None,
    choices: tuple[str, ...] | None = None,
    resume: bool = True,
) -> typing.Any:  # a dataclass field, typed as its default for the class body
    """A :class:`TrainConfig` field with its ``--help`` text and checks."""
    return field(
        default=default,
        metadata={
            "help": help,
            "metavar": metavar,
            "bound": bound,
            "maximum": maximum,
            "below": below,
            "choices": choices,
            "resume": resume,
        },
    )


# Precomputed before training starts (eval_iters x 2 splits batch starts): beyond this the set-up alone
# takes minutes
EVAL_ITERS_MAXIMUM = 100_000
# Each metrics thread holds its own copies of the attention weights
METRICS_THREADS_MAXIMUM = 256
# A run's length and every interval counted in its steps: 2,000 times the paper's 5,000 steps and 16 times
# GPT-2's 600,000 in nanoGPT. A run of 10^12 steps would never end, and every row of metrics.csv is kept in
# memory and in each checkpoint (ROWS_MAXIMUM).
STEPS_MAXIMUM = 10_000_000
# metrics.csv's rows (max_iters / log_every): a million rows of ~40 numbers is about a GB in memory, saved
# again at every checkpoint.
ROWS_MAXIMUM = 1_000_000
# The model's shape, far beyond what the pipeline trains (the paper's E = 384, 6 layers, 6 heads, block
# 256) and beyond the largest published transformers (E = 16,384, 126 layers, 128 heads): a config that
# asks for more is a typo, refused before any job instead of by a job's memory check
# (attnid.model.footprint) after others have run.
LAYERS_MAXIMUM = 1_024
HEADS_MAXIMUM = 4_096
WIDTH_MAXIMUM = 65_536
BLOCK_SIZE_MAXIMUM = 1_048_576
BATCH_SIZE_MAXIMUM = 1_048_576


@dataclass
class TrainConfig:
    data: str | None = option(
        None,
        "prepared data directory (train.bin, val.bin, meta.json from 'attnid prepare'); required",
        metavar="DIR",
        resume=False,
    )
    out: str | None = option(
        None, "run directory for metrics.csv, run.json, ckpt.pt; required", metavar="RUN_DIR", resume=False
    )
    case: str = option("adamw", "optimizer case: {cases}", metavar="CASE")
    lr: float | None = option(None, "peak learning rate (default per case: {default_lrs})", bound="positive")
    seed: int = option(
        1337,
        "seed for the init, the batches and dropout (default 1337)",
        bound="non_negative",
        maximum=SEED_MAXIMUM,
    )
    max_iters: int = option(5000, "optimizer steps (default 5000)", bound="positive", maximum=STEPS_MAXIMUM)
    log_every: int = option(
        10,
        "a metrics.csv row every K steps, plus the last step and every rebalance (default 10)",
        bound="positive",
        maximum=STEPS_MAXIMUM,
    )
    eval_every: int = option(
        250,
        "eval train/val loss every N steps, at step 0 and at the end (default 250)",
        bound="positive",
        maximum=STEPS_MAXIMUM,
    )
    eval_iters: int = option(
        20, "batches per eval split (default 20)", bound="positive", maximum=EVAL_ITERS_MAXIMUM
    )
    ckpt_every: int = option(
        250,
        "save ckpt.pt every N steps (default 250); also on SIGTERM/SIGINT and at the end",
        bound="positive",
        maximum=STEPS_MAXIMUM,
    )
    n_layer: int = option(4, "transformer blocks (default 4)", bound="positive", maximum=LAYERS_MAXIMUM)
    n_head: int = option(4, "heads per block (default 4)", bound="positive", maximum=HEADS_MAXIMUM)
    n_embd: int = option(128, "embedding width E (default 128)", bound="positive", maximum=WIDTH_MAXIMUM)
    n_kv_head: int | None = option(
        None,
        "key/value heads G (grouped-query attention, G divides --n-head; 1 = "
        "multi-query) (default: --n-head, multi-head)",
        metavar="G",
        bound="positive",
        maximum=HEADS_MAXIMUM,
    )
    rope: bool = option(
        False,
        "rotary position embeddings on queries and keys (base 10000, half-split planes) "
        "instead of the learned position embedding",
    )
    head_dim: int | None = option(
        None,
        "width D of each head (default E / H; even under --rope)",
        metavar="D",
        bound="positive",
        maximum=WIDTH_MAXIMUM,
    )
    block_size: int = option(64, "context length (default 64)", bound="positive", maximum=BLOCK_SIZE_MAXIMUM)
    batch_size: int = option(
        12, "sequences per step (default 12)", bound="positive", maximum=BATCH_SIZE_MAXIMUM
    )
    dropout: float = option(0.0, "dropout probability (default 0.0)", bound="non_negative", below=1)
    bias: bool = option(False, "biases in Linears and LayerNorms (default off, as nanoGPT's CPU config)")
    weight_decay: float = option(
        0.1,
        "weight decay for sgd_wd (coupled L2) and the adamw cases (decoupled) (default 0.1)",
        bound="non_negative",
    )
    momentum: float = option(0.9, "momentum of sgd_momentum (default 0.9)", bound="non_negative")
    beta1: float = option(0.9, "AdamW beta1 (default 0.9)")
    beta2: float = option(0.99, "AdamW beta2 (default 0.99)")
    grad_clip: float = option(
        1.0, "clip the gradient norm at this value, 0 = off (default 1.0)", bound="non_negative"
    )
    warmup_iters: int | None = option(
        None,
        "linear warmup steps (default min(100, max_iters // 10))",
        bound="non_negative",
        maximum=STEPS_MAXIMUM,
    )
    lr_decay_iters: int | None = option(None, "cosine decay length (default max_iters)")
    min_lr: float | None = option(
        None, "learning rate at the end of the decay (default lr / 10)", bound="non_negative"
    )
    rebalance_every: int = option(
        200,
        "rebalancing cases: rebalance every N steps (default 200)",
        bound="positive",
        maximum=STEPS_MAXIMUM,
    )
    rebalance_target: str = option(
        "initial",
        "rebalancing cases: target imbalance, 'initial' (I_0) or 'balanced' (0) (default initial)",
        choices=REBALANCE_TARGETS,
    )
    rebalance_moments: str = option(
        "keep",
        "rebalancing cases: the attention weights' AdamW moments at "
        "each rebalance: keep (as they are), first-moment (the first "
        "mapped with the orbit move, the second kept) or reset (dropped) "
        "(default keep)",
        metavar="HOW",
        choices=REBALANCE_MOMENTS,
    )
    initial_point: str | None = option(
        None,
        "where training starts on each attention pair's orbit: init (the initialisation of --seed) or gauge "
        "(moved along the orbits to adamw_gauge_fixed's gauge point: the same function, docs/design.md §14); "
        "for adamw_gauge_fixed also where its blocks are fixed (init: at their initial values) (default: "
        "gauge for adamw_gauge_fixed, init otherwise)",
        metavar="WHERE",
        choices=INITIAL_POINTS,
    )
    freeze_mlp: bool = option(
        False,
        "freeze as many MLP weight entries as adamw_gauge_fixed fixes in attention (2 G D^2 per layer), "
        "drawn at random from --seed, at their initial values: a control outside attention "
        "(docs/design.md §14)",
    )
    arm: str | None = option(
        None,
        "the run's name as an arm of 'attnid interventions-table' (default: its case and options, e.g. "
        "adamw_gauge_fixed_at_init); name an arm that differs from another only by its settings (--lr)",
        metavar="NAME",
        resume=False,
    )
    full_val_eval: bool = option(
        False,
        "at the end, evaluate the final model on the whole val split, every token once "
        "(run.json's final_val_loss_full: the interventions' primary metric, docs/design.md §11.5; "
        "seconds on a CPU)",
        resume=False,
    )
    full_val_every: int | None = option(
        None,
        "also evaluate on the whole val split at step 0 and every N steps (metrics.csv's val_loss_full: the "
        "interventions' effect along training, docs/design.md §11.5); implies --full-val-eval (default off)",
        metavar="N",
        bound="positive",
        resume=False,
    )
    diverge_threshold: float | None = option(
        None,
        "stop as 'diverged' when the loss is NaN/inf or above this (default 3 x first loss)",
        bound="positive",
    )
    metrics: bool = option(True, "measure rho, beta, tau, mu (--no-metrics: only losses; for benchmarks)")
    tau_every: int = option(
        1,
        "runs without rebalancing: measure tau by a probe rebalance on every N-th row "
        "with metrics, row 0 included (default 1: every row)",
        metavar="N",
        bound="positive",
        maximum=STEPS_MAXIMUM,
    )
    metrics_threads: int = option(
        0,
        "worker threads that compute the metrics while training goes on (the "
        "rows are the same); 0 = on the training thread (default 0)",
        metavar="N",
        bound="non_negative",
        maximum=METRICS_THREADS_MAXIMUM,
        resume=False,
    )
    metrics_device: str = option(
        "auto",
        "where the metrics' float64 linear algebra runs at a log step: host (copy "
        "the attention weights to the CPU threads), device (where the model "
        "trains) or auto (host when training on CUDA, else device) (default "
        "auto)",
        metavar="WHERE",
        choices=("auto", *METRICS_DEVICES),
    )
    compile: bool | None = option(
        None,
        "torch.compile the model for training (default: on for CUDA, off on "
        "the CPU); checkpoints keep nanoGPT's parameter names",
    )
    threads: int = option(
        1, "torch CPU threads (default 1)", bound="positive", maximum=THREADS_MAXIMUM, resume=False
    )
    device: str = option(
        "auto", "auto (CUDA when present), cpu or cuda (default auto)", metavar="DEVICE", choices=DEVICES
    )
    dtype: str = option(
        "auto",
        "training precision: auto (float32 on CPU, bf16 on CUDA), bf16 (CUDA autocast, "
        "TF32), float32 (true float32, TF32 off) or float64 (default auto)",
        metavar="DTYPE",
        choices=("auto", *DTYPES),
    )
    fresh: bool = option(False, "ignore an existing ckpt.pt in --out and start over", resume=False)
    restart_if_changed: bool = option(
        False,
        "start over where --out's ckpt.pt was written with other settings (the run's settings changed "
        "since), replacing it; without this such a checkpoint is refused (the workflow's jobs pass it: they "
        "rerun when their run's settings change)",
        resume=False,
    )
    # test hook: behave as if SIGTERM arrived after this step
    stop_after: int | None = option(None, None, resume=False)
    progress_every: float = option(
        5.0, "seconds between progress lines on stderr (default 5)", bound="positive", resume=False
    )

    @property
    def attention(self) -> LayerShape:
        """The shape of each attention layer these options build (``--n-kv-head`` and ``--head-dim`` filled
        in: ``G = H``, ``D = E/H`` when not given; values as wide as keys; ``--bias`` on every projection).
        Built, not stored: each of its settings is a flag."""
        head_dim = self.head_dim if self.head_dim is not None else self.n_embd // self.n_head
        n_kv_head = self.n_kv_head if self.n_kv_head is not None else self.n_head
        return LayerShape(
            self.n_embd, self.n_head, n_kv_head, head_dim, head_dim, self.rope, self.bias, self.bias
        )


def option_names() -> list[str]:
    return [f.name for f in fields(TrainConfig)]


def resume_free_keys() -> tuple[str, ...]:
    """Keys that may differ between a checkpoint and the command resuming it."""
    return tuple(f.name for f in fields(TrainConfig) if not f.metadata["resume"])


@functools.cache
def option_type(name: str) -> type:
    """int, float, str or bool: the annotation of field ``name`` without its ``| None``."""
    hint = typing.get_type_hints(TrainConfig)[name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    return hint


def help_text(name: str) -> str | None:
    """The ``--help`` line of an option; case lists and default learning rates come from the case registry."""
    text = next(f.metadata["help"] for f in fields(TrainConfig) if f.name == name)
    if text is None:
        return None
    default_lrs = ", ".join(f"{c.name} {c.default_lr:g}" for c in cases.CASES.values())
    return text.format(cases=", ".join(cases.CASES), default_lrs=default_lrs)


def _coerce(name: str, value, source: str):
    kind = option_type(name)
    shown = reprlib.repr(value)  # a long list in a config file is named, not printed whole
    if value is None:
        return None
    if kind is bool:
        if not isinstance(value, bool):
            raise UserError(f"{source}: '{name}' must be true or false, not {shown}")
        return value
    if kind is int and (isinstance(value, bool) or (isinstance(value, float) and not value.is_integer())):
        raise UserError(f"{source}: '{name}' must be an integer, not {shown}")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise UserError(f"{source}: '{name}' must be a {kind.__name__}, not {shown}") from None


def read_config_file(path: str | os.PathLike) -> dict:
    """Options from a YAML file (keys as the flags, underscored). Unknown keys are an error."""
    content = read_yaml(path, "config file") or {}
    if not isinstance(content, dict):
        raise UserError(f"config file {path} must be a mapping of option: value")
    for name, message in REPLACED_OPTIONS.items():
        if name in content:
            raise UserError(f"config file {path}: {message}")
    unknown = sorted(str(k) for k in content if k not in option_names())
    if unknown:
        raise UserError(
            f"config file {path}: unknown keys {reprlib.repr(unknown)}; valid keys are the flags of "
            f"'attnid train --help' with underscores"
        )
    return {k: _coerce(k, v, f"config file {path}") for k, v in content.items()}


def _alternatives(choices: tuple[str, ...]) -> str:
    return " or ".join(filter(None, (", ".join(choices[:-1]), choices[-1])))


def _check_choices(cfg: TrainConfig) -> None:
    for f in fields(TrainConfig):
        value, choices = getattr(cfg, f.name), f.metadata["choices"]
        if choices is not None and value is not None and value not in choices:  # None: a derived default
            raise UserError(
                f"unknown --{f.name.replace('_', '-')} {value!r}: choose {_alternatives(choices)}"
            )


def _check_bounds(cfg: TrainConfig) -> None:
    """Each option's ``bound`` (finite and positive or non-negative) and ``maximum``; every positive option
    is checked before the non-negative ones."""
    for bound in ("positive", "non_negative"):
        for f in fields(TrainConfig):
            value = getattr(cfg, f.name)
            if f.metadata["bound"] != bound or value is None:  # None: the option's derived default
                continue
            flag = "--" + f.name.replace("_", "-")
            if bound == "positive" and not (value > 0 and math.isfinite(value)):
                raise UserError(f"{flag} must be positive and finite, not {value}")
            if bound == "non_negative" and not (value >= 0 and math.isfinite(value)):
                raise UserError(f"{flag} must be >= 0 and finite, not {value}")
    for f in fields(TrainConfig):
        value, maximum, below = getattr(cfg, f.name), f.metadata["maximum"], f.metadata["below"]
        if maximum is not None and value is not None and value > maximum:
            raise UserError(f"--{f.name.replace('_', '-')} {value} is above its limit of {maximum}")
        if below is not None and value is not None and not value < below:
            raise UserError(f"--{f.name.replace('_', '-')} must be below {below}, not {value}")


def _check_attention_shape(cfg: TrainConfig) -> None:
    """The attention variant must be buildable (docs/design.md §8): one line per problem."""
    if cfg.head_dim is None and cfg.n_embd % cfg.n_head:
        raise UserError(
            f"--n-embd {cfg.n_embd} is not a multiple of --n-head {cfg.n_head} (or give --head-dim)"
        )
    if cfg.n_kv_head is not None and cfg.n_head % cfg.n_kv_head:
        raise UserError(f"--n-kv-head {cfg.n_kv_head} must divide --n-head {cfg.n_head}")
    head_dim = cfg.head_dim if cfg.head_dim is not None else cfg.n_embd // cfg.n_head
    if cfg.rope and head_dim % 2:
        raise UserError(f"--rope needs an even head width, got D = {head_dim} (choose --head-dim)")
    # the stock values mean the stock model: same resume key and nanoGPT model_args as leaving them out
    if cfg.n_kv_head == cfg.n_head:
        cfg.n_kv_head = None
    if cfg.head_dim is not None and cfg.head_dim * cfg.n_head == cfg.n_embd:
        cfg.head_dim = None


def lockstep_refusal(
    cfg: TrainConfig, compiled: bool | None = None, scaled: bool | None = None
) -> str | None:
    """What in a run's settings keeps it from training in lockstep (attnid.training.lockstep), or None;
    the pipeline's plan asks it of every run a lockstep job trains, before any job starts. ``compiled`` and
    ``scaled``: what a built run resolved (compiling by default on CUDA, fp16's gradient scaler); without
    them, what the settings ask."""
    compiled = bool(cfg.compile) if compiled is None else compiled
    scaled = cfg.dtype == "fp16" if scaled is None else scaled
    case = cases.get_case(cfg.case)
    if cfg.metrics:
        return "it measures rho, beta, tau, mu (--metrics): lockstep trains with --no-metrics only"
    if case.rebalances or case.projects_steps:
        return f"case {case.name} moves the weights between steps"
    if cfg.dropout:
        return "--dropout is not 0"
    if compiled:
        return "--compile is on"
    if scaled:
        return "--dtype fp16 needs a gradient scaler per run"
    return None


def resolve_config(values: dict) -> TrainConfig:
    """Fill the derived defaults and check every value; raises UserError with one clear line."""
    cfg = TrainConfig(**{k: v for k, v in values.items() if v is not None})
    if cfg.data is None:
        raise UserError("missing --data DIR (the prepared data directory from 'attnid prepare')")
    if cfg.out is None:
        raise UserError("missing --out RUN_DIR (where metrics.csv, run.json and ckpt.pt go)")
    case = cases.get_case(cfg.case)
    if cfg.rebalance_moments in RETIRED_MOMENTS:
        raise UserError(RETIRED_MOMENTS[cfg.rebalance_moments])
    _check_choices(cfg)
    if cfg.lr is None:
        cfg.lr = case.default_lr
    _check_bounds(cfg)
    rows = cfg.max_iters // cfg.log_every
    if rows > ROWS_MAXIMUM:
        raise UserError(
            f"--max-iters {cfg.max_iters} at --log-every {cfg.log_every} is {rows:,} rows of metrics.csv, "
            f"more than {ROWS_MAXIMUM:,} (each row is kept in memory and in every checkpoint): log less often"
        )
    if not (0 <= cfg.beta1 < 1 and 0 <= cfg.beta2 < 1):
        raise UserError("--beta1 and --beta2 must be in [0, 1)")
    _check_attention_shape(cfg)
    if cfg.initial_point is None:
        cfg.initial_point = GAUGE_POINT if case.gauge_fixed else INITIAL_VALUES
    if case.gauge_fixed or cfg.initial_point == GAUGE_POINT:
        check_gauge_layout(cfg.attention)
    if cfg.arm is not None and not ARM_NAME.fullmatch(cfg.arm):
        raise UserError(
            f"--arm {cfg.arm!r}: a name of lower-case letters, digits and _, starting with a letter"
        )
    if cfg.warmup_iters is None:
        cfg.warmup_iters = min(100, cfg.max_iters // 10)
    if cfg.lr_decay_iters is None:
        cfg.lr_decay_iters = cfg.max_iters
    if cfg.min_lr is None:
        cfg.min_lr = cfg.lr / 10
    if cfg.warmup_iters < 0 or cfg.lr_decay_iters <= cfg.warmup_iters:
        raise UserError(
            f"need 0 <= --warmup-iters ({cfg.warmup_iters}) < --lr-decay-iters ({cfg.lr_decay_iters})"
        )
    if cfg.stop_after is not None and cfg.stop_after < 1:
        raise UserError("--stop-after must be >= 1")
    return cfg
