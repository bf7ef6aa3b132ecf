"""``attnid train``: one training run (optimizer case, learning rate, seed) with ρ, β, τ, μ logged.

The loop is nanoGPT's ``train.py`` (cosine schedule with linear warmup, gradient
clipping, periodic train/val evaluation) with the measurements of the paper's §5
around the optimizer step:

    loss.backward(); clip
    pre = tracker.snapshot(model)           # log steps only: float64 copy of the attention weights
    optimizer.step()
    rho  <- tracker.step_metrics(model, pre) # unidentified share of the step just taken (E1, E2)
    tau  <- tracker.rebalance(...)           # rebalance steps: orbit move in place (E3)
         or tracker.tau_probe(model)         # other log steps of runs without rebalancing: on a copy
    beta, mu <- tracker.state_metrics(model)

Cases (``CASES``): ``sgd``, ``sgd_wd``, ``sgd_momentum``, ``adamw``,
``adamw_rebalance``. A run directory holds ``metrics.csv`` (one row per log step),
``run.json`` (status and summary, written last) and ``ckpt.pt`` (nanoGPT's
checkpoint format plus our RNG states and the metric rows so far, so that rerunning
the same command resumes exactly). See the README's "experiments" section.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from attnid import __version__
from attnid.errors import UserError
from attnid.files import torch_save_atomic, write_csv_atomic, write_json_atomic
from attnid.model import GPT, GPTConfig

CASES = {
    "sgd": "plain SGD, no momentum, no weight decay: the imbalance is conserved (E1)",
    "sgd_wd": "SGD with coupled L2 weight decay (--weight-decay) on matrices and embeddings (E2)",
    "sgd_momentum": "SGD with heavy-ball momentum (--momentum, 0.9), no weight decay",
    "adamw": "nanoGPT's AdamW: betas (0.9, 0.99), decoupled weight decay on matrices and embeddings (E2)",
    "adamw_rebalance": "adamw, plus every --rebalance-every steps each attention pair moved along its orbit (E3)",
}
# Peak learning rate when --lr is not given: nanoGPT shakespeare-char's for AdamW; SGD needs a larger one.
DEFAULT_LR = {"sgd": 0.1, "sgd_wd": 0.1, "sgd_momentum": 0.01, "adamw": 1e-3, "adamw_rebalance": 1e-3}
REBALANCE_TARGETS = ("initial", "balanced")
DEVICES = ("auto", "cpu", "cuda")

# metrics.csv: these columns first, in this order; per-layer columns (e.g. rho_qk_l0) follow.
BASE_COLUMNS = ("step", "lr", "train_loss", "eval_train_loss", "val_loss", "rho_qk", "rho_ov", "beta_qk", "beta_ov",
                "tau", "tau_logits", "mu_qk", "mu_ov", "grad_norm", "tokens_per_s", "wall_s", "rebalanced",
                "skipped_pairs")
# Columns that measure the clock, not the run: the only ones that differ between identical runs.
TIMING_COLUMNS = ("tokens_per_s", "wall_s")

# Offsets that give the fixed probe/eval batches their own seeds, apart from the training batches'.
PROBE_SEED_OFFSET = 7_919
# Sequences in the fixed probe batch of tau: round-off shows on a few sequences as well as on many,
# and the probe's two forward passes at every log step are most of the metrics' cost.
PROBE_SEQUENCES = 2
EVAL_SEED_OFFSET = 104_729
CHECKPOINT_FORMAT = 1


# --------------------------------------------------------------------------------------
# configuration: one table drives the flags, the --config file and validation
# --------------------------------------------------------------------------------------

@dataclass
class TrainConfig:
    data: str | None = None
    out: str | None = None
    case: str = "adamw"
    lr: float | None = None  # None -> DEFAULT_LR[case]
    seed: int = 1337
    max_iters: int = 5000
    log_every: int = 10
    eval_every: int = 250
    eval_iters: int = 20
    ckpt_every: int = 250
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 64
    batch_size: int = 12
    dropout: float = 0.0
    bias: bool = False
    weight_decay: float = 0.1
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    warmup_iters: int | None = None  # None -> min(100, max_iters // 10)
    lr_decay_iters: int | None = None  # None -> max_iters
    min_lr: float | None = None  # None -> lr / 10
    rebalance_every: int = 200
    rebalance_target: str = "initial"
    reset_optimizer_state: bool = False
    diverge_threshold: float | None = None  # None -> 3 x the first step's loss
    metrics: bool = True
    threads: int = 1
    device: str = "auto"
    fresh: bool = False
    stop_after: int | None = None  # test hook: behave as if SIGTERM arrived after this step
    progress_every: float = 5.0


HELP = {
    "data": "prepared data directory (train.bin, val.bin, meta.json from 'attnid prepare'); required",
    "out": "run directory for metrics.csv, run.json, ckpt.pt; required",
    "case": "optimizer case: " + ", ".join(CASES),
    "lr": "peak learning rate (default per case: " + ", ".join(f"{c} {v:g}" for c, v in DEFAULT_LR.items()) + ")",
    "seed": "seed for the init, the batches and dropout (default 1337)",
    "max_iters": "optimizer steps (default 5000)",
    "log_every": "a metrics.csv row every K steps, plus the last step and every rebalance (default 10)",
    "eval_every": "eval train/val loss every N steps, at step 0 and at the end (default 250)",
    "eval_iters": "batches per eval split (default 20)",
    "ckpt_every": "save ckpt.pt every N steps (default 250); also on SIGTERM/SIGINT and at the end",
    "n_layer": "transformer blocks (default 4)", "n_head": "heads per block (default 4)",
    "n_embd": "embedding width E (default 128)", "block_size": "context length (default 64)",
    "batch_size": "sequences per step (default 12)", "dropout": "dropout probability (default 0.0)",
    "bias": "biases in Linears and LayerNorms (default off, as nanoGPT's CPU config)",
    "weight_decay": "weight decay for sgd_wd (coupled L2) and the adamw cases (decoupled) (default 0.1)",
    "momentum": "momentum of sgd_momentum (default 0.9)",
    "beta1": "AdamW beta1 (default 0.9)", "beta2": "AdamW beta2 (default 0.99)",
    "grad_clip": "clip the gradient norm at this value, 0 = off (default 1.0)",
    "warmup_iters": "linear warmup steps (default min(100, max_iters // 10))",
    "lr_decay_iters": "cosine decay length (default max_iters)",
    "min_lr": "learning rate at the end of the decay (default lr / 10)",
    "rebalance_every": "adamw_rebalance: rebalance every N steps (default 200)",
    "rebalance_target": "adamw_rebalance: target imbalance, 'initial' (I_0) or 'balanced' (0) (default initial)",
    "reset_optimizer_state": "adamw_rebalance: drop the AdamW moments of the attention weights at each rebalance",
    "diverge_threshold": "stop as 'diverged' when the loss is NaN/inf or above this (default 3 x first loss)",
    "metrics": "measure rho, beta, tau, mu (--no-metrics: only losses; for benchmarks)",
    "threads": "torch CPU threads (default 1)",
    "device": "auto (CUDA when present), cpu or cuda (default auto)",
    "fresh": "ignore an existing ckpt.pt in --out and start over",
    "progress_every": "seconds between progress lines on stderr (default 5)",
}
# Keys that may differ between a checkpoint and the command that resumes it.
RESUME_FREE_KEYS = ("data", "out", "threads", "fresh", "stop_after", "progress_every")


def _field_caster(name: str):
    """The conversion for a config key: int, float, str or bool (from the dataclass annotation)."""
    annotation = next(f.type for f in fields(TrainConfig) if f.name == name)
    if "bool" in annotation:
        return bool
    if "int" in annotation:
        return int
    if "float" in annotation:
        return float
    return str


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML file with any of these options (underscored keys); "
                                                          "flags given on the command line override it")
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        caster = _field_caster(f.name)
        if f.name == "stop_after":
            parser.add_argument(flag, type=int, default=None, help=argparse.SUPPRESS)
        elif caster is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=HELP[f.name])
        else:
            metavar = {"case": "CASE", "device": "DEVICE", "data": "DIR", "out": "RUN_DIR"}.get(f.name)
            parser.add_argument(flag, type=caster, default=None, metavar=metavar, help=HELP[f.name])


def _coerce(name: str, value, source: str):
    caster = _field_caster(name)
    if value is None:
        return None
    if caster is bool:
        if not isinstance(value, bool):
            raise UserError(f"{source}: '{name}' must be true or false, not {value!r}")
        return value
    if caster is int and (isinstance(value, bool) or (isinstance(value, float) and not value.is_integer())):
        raise UserError(f"{source}: '{name}' must be an integer, not {value!r}")
    try:
        return caster(value)
    except (TypeError, ValueError):
        raise UserError(f"{source}: '{name}' must be a {caster.__name__}, not {value!r}") from None


def read_config_file(path: str | os.PathLike) -> dict:
    """Options from a YAML file (keys as the flags, underscored). Unknown keys are an error."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file {path} does not exist")
    try:
        content = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise UserError(f"config file {path} is not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(content, dict):
        raise UserError(f"config file {path} must be a mapping of option: value")
    known = {f.name for f in fields(TrainConfig)}
    unknown = sorted(str(k) for k in content if k not in known)
    if unknown:
        raise UserError(f"config file {path}: unknown keys {unknown}; valid keys are the flags of "
                        f"'attnid train --help' with underscores")
    return {k: _coerce(k, v, f"config file {path}") for k, v in content.items()}


def resolve_config(values: dict) -> TrainConfig:
    """Fill the derived defaults and check every value; raises UserError with one clear line."""
    cfg = TrainConfig(**{k: v for k, v in values.items() if v is not None})
    if cfg.data is None:
        raise UserError("missing --data DIR (the prepared data directory from 'attnid prepare')")
    if cfg.out is None:
        raise UserError("missing --out RUN_DIR (where metrics.csv, run.json and ckpt.pt go)")
    if cfg.case not in CASES:
        raise UserError(f"unknown case {cfg.case!r}: choose one of {', '.join(CASES)}")
    if cfg.rebalance_target not in REBALANCE_TARGETS:
        raise UserError(f"unknown --rebalance-target {cfg.rebalance_target!r}: choose initial or balanced")
    if cfg.device not in DEVICES:
        raise UserError(f"unknown --device {cfg.device!r}: choose auto, cpu or cuda")
    if cfg.lr is None:
        cfg.lr = DEFAULT_LR[cfg.case]
    positive = ["lr", "max_iters", "log_every", "eval_every", "eval_iters", "ckpt_every", "n_layer", "n_head",
                "n_embd", "block_size", "batch_size", "rebalance_every", "threads", "progress_every"]
    for name in positive:
        value = getattr(cfg, name)
        if not (value > 0 and math.isfinite(value)):
            raise UserError(f"--{name.replace('_', '-')} must be positive, not {value}")
    non_negative = ["weight_decay", "momentum", "grad_clip", "dropout"]
    for name in non_negative:
        if not getattr(cfg, name) >= 0:
            raise UserError(f"--{name.replace('_', '-')} must be >= 0, not {getattr(cfg, name)}")
    if not cfg.dropout < 1:
        raise UserError(f"--dropout must be below 1, not {cfg.dropout}")
    if not (0 <= cfg.beta1 < 1 and 0 <= cfg.beta2 < 1):
        raise UserError("--beta1 and --beta2 must be in [0, 1)")
    if cfg.n_embd % cfg.n_head:
        raise UserError(f"--n-embd {cfg.n_embd} is not a multiple of --n-head {cfg.n_head}")
    if cfg.warmup_iters is None:
        cfg.warmup_iters = min(100, cfg.max_iters // 10)
    if cfg.lr_decay_iters is None:
        cfg.lr_decay_iters = cfg.max_iters
    if cfg.min_lr is None:
        cfg.min_lr = cfg.lr / 10
    if cfg.warmup_iters < 0 or cfg.lr_decay_iters <= cfg.warmup_iters:
        raise UserError(f"need 0 <= --warmup-iters ({cfg.warmup_iters}) < --lr-decay-iters ({cfg.lr_decay_iters})")
    if cfg.diverge_threshold is not None and not cfg.diverge_threshold > 0:
        raise UserError(f"--diverge-threshold must be positive, not {cfg.diverge_threshold}")
    if cfg.stop_after is not None and cfg.stop_after < 1:
        raise UserError("--stop-after must be >= 1")
    return cfg


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    values = read_config_file(args.config) if getattr(args, "config", None) else {}
    for f in fields(TrainConfig):  # explicit flags override the file
        flag_value = getattr(args, f.name, None)
        if flag_value is not None:
            values[f.name] = flag_value
    return resolve_config(values)


# --------------------------------------------------------------------------------------
# the pieces of nanoGPT's loop
# --------------------------------------------------------------------------------------

def get_lr(it: int, cfg: TrainConfig) -> float:
    """nanoGPT's schedule for 0-based step ``it``: linear warmup, cosine decay to min_lr, then flat."""
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / (cfg.warmup_iters + 1)
    if it > cfg.lr_decay_iters:
        return cfg.min_lr
    decay_ratio = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # 1 -> 0
    return cfg.min_lr + coeff * (cfg.lr - cfg.min_lr)


def make_optimizer(model: GPT, cfg: TrainConfig, device_type: str) -> torch.optim.Optimizer:
    """The optimizer of a case. Weight decay (where used) acts on >= 2-D tensors only, as nanoGPT's groups."""
    if cfg.case == "sgd":
        return torch.optim.SGD(model.optimizer_groups(0.0), lr=cfg.lr, momentum=0.0)
    if cfg.case == "sgd_wd":
        # torch's SGD weight_decay adds wd * theta to the gradient: coupled L2, I_t ~ prod(1 - lr wd)^2 I_0
        return torch.optim.SGD(model.optimizer_groups(cfg.weight_decay), lr=cfg.lr, momentum=0.0)
    if cfg.case == "sgd_momentum":
        return torch.optim.SGD(model.optimizer_groups(0.0), lr=cfg.lr, momentum=cfg.momentum)
    extra = {"fused": True} if device_type == "cuda" else {}
    return torch.optim.AdamW(model.optimizer_groups(cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             **extra)


def batch_from_starts(data: np.ndarray, starts: torch.Tensor, block_size: int, device: torch.device):
    """Token windows data[s : s+T+1] for each start s -> inputs x (B, T) and next-token targets y (B, T)."""
    offsets = starts.numpy()[:, None] + np.arange(block_size + 1)  # (B, T+1)
    window = torch.from_numpy(data[offsets].astype(np.int64))  # (B, T+1)
    x, y = window[:, :-1].contiguous(), window[:, 1:].contiguous()
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


def random_starts(n_tokens: int, batch_size: int, block_size: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(n_tokens - block_size, (batch_size,), generator=generator)  # (B,)


class FixedEvalBatches:
    """The same ``eval_iters`` batches per split at every eval, so eval losses differ only by the model."""

    def __init__(self, splits: dict, cfg: TrainConfig, device: torch.device):
        self.splits, self.block_size, self.device = splits, cfg.block_size, device
        generator = torch.Generator().manual_seed(cfg.seed + EVAL_SEED_OFFSET)
        self.starts = {name: [random_starts(len(data), cfg.batch_size, cfg.block_size, generator)
                              for _ in range(cfg.eval_iters)] for name, data in splits.items()}

    @torch.no_grad()
    def losses(self, model: GPT, autocast) -> dict[str, float]:
        was_training = model.training
        model.eval()
        out = {}
        for name, data in self.splits.items():
            total = 0.0
            for starts in self.starts[name]:
                x, y = batch_from_starts(data, starts, self.block_size, self.device)
                with autocast():
                    _, loss = model(x, y)
                total += loss.item()
            out[name] = total / len(self.starts[name])
        model.train(was_training)
        return out


def resolve_device(requested: str) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but torch sees no CUDA device; use --device cpu or auto")
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def git_commit() -> str | None:
    """The commit of the attnid source tree, or None outside a git checkout."""
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None


def _finite_or_none(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def _say(message: str) -> None:
    print(f"attnid train: {message}", file=sys.stderr, flush=True)


class StopSignals:
    """Turns SIGTERM/SIGINT into a flag the loop checks after each step (then: checkpoint, exit 143/130)."""

    def __init__(self):
        self.signum: int | None = None
        self._previous = {}

    def __enter__(self):
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread: no handlers, no graceful stop
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame):
        self.signum = signum

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        return False


# --------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------

def resume_key(cfg: TrainConfig, device: torch.device, meta: dict) -> dict:
    """What must agree between a checkpoint and the command resuming it."""
    key = {k: v for k, v in asdict(cfg).items() if k not in RESUME_FREE_KEYS}
    key["device"] = device.type
    key["data"] = {k: meta.get(k) for k in ("vocab_size", "train_tokens", "val_tokens", "source_sha256")}
    return key


def _load_checkpoint(path: Path, key: dict) -> dict:
    try:
        # on the CPU: RNG states must stay CPU tensors; load_state_dict moves weights and moments to the device
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
        ours = checkpoint["attnid"]
        stored_key = ours["resume_key"]
    except Exception as err:  # noqa: BLE001 - a damaged or foreign file
        raise UserError(f"{path} is not a readable attnid checkpoint ({type(err).__name__}); "
                        f"delete it or pass --fresh to start over") from None
    if stored_key != key:
        differing = sorted(k for k in set(key) | set(stored_key) if key.get(k) != stored_key.get(k))
        shown = ", ".join(f"{k}: {stored_key.get(k)!r} in ckpt vs {key.get(k)!r} now" for k in differing[:3])
        raise UserError(f"{path} belongs to a run with another configuration ({shown}); "
                        f"delete it or pass --fresh to start over")
    return checkpoint


def write_outputs(out: Path, rows: list[dict], summary: dict) -> None:
    """metrics.csv, then run.json last: a run.json means the run's outputs are complete."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    extra = [c for c in frame.columns if c not in BASE_COLUMNS]
    frame = frame.reindex(columns=list(BASE_COLUMNS) + extra)
    write_csv_atomic(out / "metrics.csv", frame)
    write_json_atomic(out / "run.json", {k: _finite_or_none(v) for k, v in summary.items()})


def versions() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "attnid": __version__}


def train(cfg: TrainConfig) -> int:
    """Run (or resume) one training run; returns the exit status (0 also for a diverged run)."""
    from attnid.data import load_meta, load_split

    torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    def autocast():
        if device.type == "cuda":
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    meta = load_meta(cfg.data)
    splits = {"train": load_split(cfg.data, "train"), "val": load_split(cfg.data, "val")}
    for name, data in splits.items():
        if len(data) <= cfg.block_size + 1:
            raise UserError(f"{name}.bin has {len(data)} tokens, fewer than --block-size {cfg.block_size} + 2")

    out = Path(cfg.out)
    ckpt_path = out / "ckpt.pt"
    key = resume_key(cfg, device, meta)
    checkpoint = _load_checkpoint(ckpt_path, key) if ckpt_path.exists() and not cfg.fresh else None
    if checkpoint is not None and checkpoint["attnid"].get("summary") is not None:
        _say(f"{ckpt_path} holds a finished run ({checkpoint['attnid']['summary']['status']}); "
             f"rewriting metrics.csv and run.json from it")
        write_outputs(out, checkpoint["attnid"]["rows"], checkpoint["attnid"]["summary"])
        return 0
    # a run.json must never describe an older run while this one is unfinished
    for stale in ("run.json", "metrics.csv"):
        with contextlib.suppress(FileNotFoundError):
            (out / stale).unlink()

    # model, optimizer and every source of randomness, seeded from --seed
    torch.manual_seed(cfg.seed)
    model_config = GPTConfig(block_size=cfg.block_size, vocab_size=int(meta["vocab_size"]), n_layer=cfg.n_layer,
                             n_head=cfg.n_head, n_embd=cfg.n_embd, dropout=cfg.dropout, bias=cfg.bias)
    model = GPT(model_config).to(device)
    model.train()
    optimizer = make_optimizer(model, cfg, device.type)
    batch_generator = torch.Generator().manual_seed(cfg.seed)
    probe_generator = torch.Generator().manual_seed(cfg.seed + PROBE_SEED_OFFSET)
    probe_batch = batch_from_starts(
        splits["train"],
        random_starts(len(splits["train"]), min(cfg.batch_size, PROBE_SEQUENCES), cfg.block_size, probe_generator),
        cfg.block_size, device)
    evaluator = FixedEvalBatches(splits, cfg, device)
    rebalancing = cfg.case == "adamw_rebalance"
    tracker = None
    if cfg.metrics or rebalancing:
        from attnid.metrics import MetricTracker

        tracker = MetricTracker(model, probe_batch=probe_batch)  # records I_0 from the initial weights

    rows: list[dict] = []
    step, first_loss, best_val_loss, wall_before, resumed_at = 0, None, 1e9, 0.0, []
    if checkpoint is not None:
        ours = checkpoint["attnid"]
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        batch_generator.set_state(ours["batch_generator"])
        torch.set_rng_state(ours["torch_rng"])
        if device.type == "cuda" and ours.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(ours["cuda_rng"], device)
        if tracker is not None:
            tracker.load_state_dict(ours["tracker"])
        rows, step, best_val_loss = list(ours["rows"]), int(checkpoint["iter_num"]), checkpoint["best_val_loss"]
        first_loss, wall_before, resumed_at = ours["first_loss"], ours["wall_s"], ours["resumed_at"] + [step]
        _say(f"resuming from {ckpt_path} at step {step}/{cfg.max_iters}")

    started = time.time()
    n_params = model.get_num_params()
    _say(f"case {cfg.case}, lr {cfg.lr:g}, seed {cfg.seed}, {n_params / 1e6:.2f}M parameters, "
         f"{device.type} ({'bf16 autocast' if device.type == 'cuda' else 'float32'}), {cfg.threads} thread(s), "
         f"{cfg.max_iters} steps -> {out}")

    def wall_s() -> float:
        return wall_before + time.time() - started

    def save_checkpoint(summary: dict | None = None) -> None:
        torch_save_atomic(ckpt_path, {
            # nanoGPT's keys: nanoGPT (and load_nanogpt_checkpoint) read model_args + model
            "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "model_args": model_config.model_args(), "iter_num": step, "best_val_loss": best_val_loss,
            "config": asdict(cfg),
            "attnid": {
                "format": CHECKPOINT_FORMAT, "resume_key": key, "rows": rows, "summary": summary,
                "batch_generator": batch_generator.get_state(), "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
                "tracker": tracker.state_dict() if tracker is not None else None,
                "first_loss": first_loss, "wall_s": wall_s(), "resumed_at": resumed_at,
            },
        })

    tokens_per_step = cfg.batch_size * cfg.block_size
    last_row_time, last_row_step = time.time(), step
    last_progress = time.time()

    def finish_row(row: dict) -> None:
        nonlocal last_row_time, last_row_step
        now = time.time()
        row["tokens_per_s"] = (step - last_row_step) * tokens_per_step / max(now - last_row_time, 1e-9)
        row["wall_s"] = wall_s()
        last_row_time, last_row_step = now, step
        rows.append(row)

    def evaluate(row: dict) -> None:
        nonlocal best_val_loss
        losses = evaluator.losses(model, autocast)
        row["eval_train_loss"], row["val_loss"] = losses["train"], losses["val"]
        best_val_loss = min(best_val_loss, losses["val"])

    if step == 0:
        # the initial state: eval losses, beta = 0, mu and tau of the initialisation
        row = {"step": 0, "rebalanced": 0}
        if cfg.metrics:
            if not rebalancing:
                row.update(tracker.tau_probe(model))
            row.update(tracker.state_metrics(model))
        evaluate(row)
        finish_row(row)

    status, diverged_step, diverged_loss, exit_code = "completed", None, None, 0
    with StopSignals() as stop:
        while step < cfg.max_iters:
            lr = get_lr(step, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x, y = batch_from_starts(splits["train"],
                                     random_starts(len(splits["train"]), cfg.batch_size, cfg.block_size,
                                                   batch_generator), cfg.block_size, device)
            with autocast():
                _, loss = model(x, y)
            loss_value = loss.item()
            if first_loss is None:
                first_loss = loss_value
            threshold = cfg.diverge_threshold if cfg.diverge_threshold is not None else 3.0 * first_loss
            if not math.isfinite(loss_value) or loss_value > threshold:
                status, diverged_step, diverged_loss = "diverged", step + 1, loss_value
                _say(f"loss {loss_value:.4g} at step {step + 1} (threshold {threshold:.4g}): run diverged")
                break
            loss.backward()
            clip = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item()

            step += 1  # from here on, `step` counts the update being made: theta_{step-1} -> theta_step
            is_rebalance = rebalancing and step % cfg.rebalance_every == 0
            is_eval = step % cfg.eval_every == 0 or step == cfg.max_iters
            is_row = step % cfg.log_every == 0 or is_eval or is_rebalance or step == cfg.max_iters
            pre = tracker.snapshot(model) if is_row and cfg.metrics else None  # rho needs the pre-step weights
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

            row = {"step": step, "lr": lr, "train_loss": loss_value, "grad_norm": grad_norm, "rebalanced": 0}
            if pre is not None:
                row.update(tracker.step_metrics(model, pre))
            if is_rebalance:
                row.update(tracker.rebalance(model, target=cfg.rebalance_target))
                row["rebalanced"] = 1
                if cfg.reset_optimizer_state:
                    for block in model.transformer.h:  # the rebalanced tensors' moments point the old way
                        for param in block.attn.parameters():
                            optimizer.state.pop(param, None)
            elif is_row and cfg.metrics and not rebalancing:
                row.update(tracker.tau_probe(model))
            if is_row and cfg.metrics:
                row.update(tracker.state_metrics(model))
            if is_eval:
                evaluate(row)
            if is_row:
                finish_row(row)

            now = time.time()
            if now - last_progress >= cfg.progress_every:
                last_progress = now
                rate = (step - (resumed_at[-1] if resumed_at else 0)) * tokens_per_step / max(now - started, 1e-9)
                eta = (cfg.max_iters - step) * tokens_per_step / max(rate, 1e-9)
                _say(f"step {step}/{cfg.max_iters} loss {loss_value:.4f} lr {lr:.2e} {rate:,.0f} tok/s "
                     f"eta {_format_duration(eta)}")

            stop_requested = stop.signum is not None or (cfg.stop_after is not None and step == cfg.stop_after)
            if stop_requested and step < cfg.max_iters:
                save_checkpoint()
                signum = stop.signum if stop.signum is not None else signal.SIGTERM
                _say(f"stopped by {signal.Signals(signum).name} after step {step}; checkpoint saved, "
                     f"rerun the same command to resume")
                return 128 + int(signum)
            if step % cfg.ckpt_every == 0 and step < cfg.max_iters:
                save_checkpoint()

    last_eval = next((r for r in reversed(rows) if not _isnan(r.get("val_loss"))), {})
    summary = {
        "status": status, "case": cfg.case, "lr": cfg.lr, "seed": cfg.seed,
        "steps_completed": step, "max_iters": cfg.max_iters,
        "diverged_step": diverged_step, "diverged_loss": diverged_loss,
        "final_train_loss": last_eval.get("eval_train_loss"), "final_val_loss": last_eval.get("val_loss"),
        "final_eval_step": last_eval.get("step"),
        "wall_time_s": wall_s(), "device": device.type, "dtype": "bfloat16" if device.type == "cuda" else "float32",
        "threads": cfg.threads, "n_params": n_params, "resumed_at": resumed_at,
        "finished_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(), "git_commit": git_commit(), "config": asdict(cfg),
    }
    save_checkpoint(summary)
    write_outputs(out, rows, summary)
    _say(f"{status} at step {step}: final val loss {summary['final_val_loss']}, "
         f"{summary['wall_time_s']:.1f} s -> {out / 'metrics.csv'}, {out / 'run.json'}")
    return exit_code


def _isnan(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def run_train(args: argparse.Namespace) -> int:
    return train(config_from_args(args))
