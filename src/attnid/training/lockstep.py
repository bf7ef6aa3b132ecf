"""Runs in lockstep (``attnid train-runs --lockstep``): runs that differ only in their seed, one step of all
of them at a time, through one stacked forward and backward (docs/design.md §11.6).

Each run is set up exactly as ``attnid train`` sets it up (:class:`attnid.training.train.Run`: its data,
its seeded initial model, its gauge point and fixed blocks, its frozen MLP entries, its batch stream, its
eval batches, its checkpoint to resume), then their parameters are stacked (:mod:`attnid.model.stacked`)
and trained together:

    loss (S,) = stacked.losses(params, x (S, B, T), y)   # each run's own batch
    loss.sum().backward()                                # each slice gets its own run's gradient
    grads at fixed and frozen entries := 0; each run's gradient clipped by its own norm
    optimizer.step() (the case's, on the stacked tensors: elementwise, so each slice is its own run's)
    fixed and frozen entries written back (AdamW's decoupled decay is what still moves them)

A gauge-fixed run trains its whole ``c_attn`` matrix with its fixed blocks' entries masked, which is the
same update as training only the free pieces (they are no parameter: no gradient, no moments, no decay).
The rows, evaluations, checkpoints and outputs are each run's own, as ``attnid train`` writes them; a run
that diverges stops recording at its divergence while the others go on. Every number differs from a lone
``attnid train`` of the same spec by float rounding only (batched kernels), and does not depend on which
runs share the batch (tests/training/test_lockstep.py).
"""

from __future__ import annotations

import math
import signal
import time
from dataclasses import asdict
from typing import cast

import torch

from attnid.common import progress
from attnid.common.errors import UserError
from attnid.model import stacked
from attnid.model.gauge import GaugeFixedQKV
from attnid.model.gpt import GPT, GPTConfig
from attnid.training import gpu_slots, rundir
from attnid.training.batches import batch_from_starts, split_losses
from attnid.training.config import lockstep_refusal
from attnid.training.loop import get_lr
from attnid.training.runtime import StopSignals, say
from attnid.training.train import Run

# The settings a run of a lockstep group may differ in from the others: its learning rate too, each run's
# step scaled to its own (Lockstep.step_at_own_lrs).
FREE_SETTINGS = ("seed", "out", "lr", "min_lr")


def why_not_lockstep(run: Run) -> str | None:
    """What keeps ``run`` from training in lockstep, or None: its settings as its device resolved them."""
    return lockstep_refusal(run.cfg, compiled=run.compiled, scaled=run.scaler.is_enabled())


def parameter_views(
    model: GPT, full: dict[str, torch.Tensor]
) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """Each of ``model``'s parameters with its entries in ``full`` (nanoGPT's names, whole matrices): the
    tensor itself, or for a gauge-fixed ``c_attn`` piece its view of the whole matrix."""
    qkv = {name: module for name, module in model.named_modules() if isinstance(module, GaugeFixedQKV)}
    views = []
    for name, param in model.named_parameters():
        owner, _, leaf = name.rpartition(".")
        if owner in qkv and leaf != "bias":
            views.append((param, qkv[owner].free_views_of(full[owner + ".weight"])[leaf]))
        else:
            views.append((param, full[name]))
    return views


class StackedModel:
    """The stacked parameters as a case's optimizer factory reads a GPT (``optimizer_groups``)."""

    def __init__(self, params: dict[str, torch.Tensor], config: GPTConfig):
        self.params, self.config = params, config

    def optimizer_groups(self, weight_decay: float) -> list[dict]:
        # GPT.optimizer_groups' own groups (of a plain model of the runs' shape), each name's stacked tensor
        with torch.device("meta"):
            model = GPT(self.config)
        names = {id(param): name for name, param in model.named_parameters()}
        return [
            group | {"params": [self.params[names[id(param)]] for param in group["params"]]}
            for group in model.optimizer_groups(weight_decay)
        ]


class Lockstep:
    """Runs built (and resumed) at the same step, trained as one: their stacked parameters, optimizer, the
    masks of their fixed and frozen entries."""

    def __init__(self, runs: list[Run]):
        self.runs = runs
        first = runs[0]
        self.cfg, self.config, self.step = first.cfg, first.model_config, first.step
        self.autocast = first.autocast
        self.params = {
            name: tensor.requires_grad_()
            for name, tensor in stacked.stack_parameters([r.model for r in runs]).items()
        }
        self.frozen = self._frozen_entries()
        # the case's own optimizer (its settings, its groups) over the stacked tensors
        model = cast(GPT, StackedModel(self.params, self.config))
        self.optimizer = first.case.make_optimizer(model, first.cfg, first.device.type)
        self._read_optimizer_states()
        self.live = [run.status != "diverged" for run in runs]

    # ----- set-up and write-back ------------------------------------------------------

    def _frozen_entries(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``{name: (mask (S, *shape), values)}``: the entries no step may move, per run: a gauge-fixed
        layer's fixed blocks and the control's frozen MLP entries, at their present values."""
        masks: dict[str, torch.Tensor] = {}
        for i, run in enumerate(self.runs):
            names = {id(param): name for name, param in run.model.named_parameters()}
            entries = [
                (name + ".weight", module.fixed_mask())
                for name, module in run.model.named_modules()
                if isinstance(module, GaugeFixedQKV)
            ]
            if run.frozen is not None:
                entries += [(names[id(param)], mask) for param, mask, _ in run.frozen.frozen]
            for name, mask in entries:
                if name not in masks:
                    masks[name] = torch.zeros_like(self.params[name], dtype=torch.bool)
                masks[name][i] |= mask.to(masks[name].device)
        return {name: (mask, self.params[name].detach().clone()) for name, mask in masks.items()}

    def _read_optimizer_states(self) -> None:
        """Resumed runs: their optimizer states (per parameter, per gauge-fixed piece) as the stacked
        optimizer's, a piece's moments at its entries of the whole matrix (zero at the fixed blocks)."""
        states = [run.optimizer.state for run in self.runs]
        keys = {
            key: value for state in states for per_param in state.values() for key, value in per_param.items()
        }
        stacked_state: dict[str, dict[str, torch.Tensor]] = {name: {} for name in self.params}
        for key, sample in keys.items():
            if sample.dim() == 0:  # AdamW's step count: every run's is the same at the same step
                for name in self.params:
                    stacked_state[name][key] = sample.clone()
                continue
            whole = {name: torch.zeros_like(param.detach()) for name, param in self.params.items()}
            for i, run in enumerate(self.runs):
                for param, view in parameter_views(run.model, {name: w[i] for name, w in whole.items()}):
                    if key in run.optimizer.state.get(param, {}):
                        view.copy_(run.optimizer.state[param][key])
            for name in self.params:
                stacked_state[name][key] = whole[name]
        for name, stacked_param in self.params.items():
            if stacked_state[name]:
                self.optimizer.state[stacked_param] = stacked_state[name]

    def write_back(self) -> None:
        """Each run's model and optimizer state from the stacked ones (before a checkpoint or the end)."""
        names = list(self.params)
        for i, run in enumerate(self.runs):
            weights = {name: param[i].detach() for name, param in self.params.items()}
            if self.config.tied:  # the tied lm_head.weight is wte's
                weights["lm_head.weight"] = weights["transformer.wte.weight"]
            run.model.load_state_dict({key: weights[key] for key in run.model.state_dict()})
            run.optimizer.state.clear()
            moments = [self.optimizer.state.get(self.params[name], {}) for name in names]
            for key in moments[0]:
                if moments[0][key].dim() == 0:
                    for _, param in run.model.named_parameters():
                        run.optimizer.state[param][key] = moments[0][key].clone()
                    continue
                whole = {name: state[key][i] for name, state in zip(names, moments, strict=True)}
                for param, view in parameter_views(run.model, whole):
                    run.optimizer.state[param][key] = view.clone()

    # ----- evaluation -------------------------------------------------------------------

    @torch.no_grad()
    def eval_losses(self) -> list[dict[str, float]]:
        """FixedEvalBatches.losses of every run: its own eval batches, the mean of their losses."""
        out: list[dict[str, float]] = [{} for _ in self.runs]
        first = self.runs[0]
        for split in first.splits:
            totals = [0.0] * len(self.runs)
            for index in range(len(first.evaluator.starts[split])):
                pairs = [
                    batch_from_starts(
                        run.splits[split], run.evaluator.starts[split][index], self.cfg.block_size, run.device
                    )
                    for run in self.runs
                ]
                with self.autocast():
                    losses = stacked.losses(self.config, self.params, *_stack(pairs))
                for i, value in enumerate(losses.tolist()):
                    totals[i] += value
            for i, total in enumerate(totals):
                out[i][split] = total / len(first.evaluator.starts[split])
        return out

    def full_split_losses(self) -> list[float]:
        """split_loss of every run on the whole val split (the same windows for all)."""
        first, cfg, size = self.runs[0], self.cfg, len(self.runs)

        def losses_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return stacked.losses(self.config, self.params, x.expand(size, -1, -1), y.expand(size, -1, -1))

        val = first.splits["val"]
        return split_losses(losses_of, val, cfg.block_size, cfg.batch_size, first.device, self.autocast)

    def evaluate(self, rows: list[dict], is_eval: bool, is_full: bool) -> None:
        if is_eval:
            for run, row, losses in zip(self.runs, rows, self.eval_losses(), strict=True):
                row["eval_train_loss"], row["val_loss"] = losses["train"], losses["val"]
                run.best_val_loss = min(run.best_val_loss, losses["val"])
        if is_full:
            for row, loss in zip(rows, self.full_split_losses(), strict=True):
                row["val_loss_full"] = loss

    def log_initial_state(self) -> None:
        rows: list[dict] = [{"step": 0, "rebalanced": 0} for _ in self.runs]
        self.evaluate(rows, True, self.runs[0].is_full_eval(0))
        for run, row in zip(self.runs, rows, strict=True):
            run.finish_row(row)

    # ----- one step ---------------------------------------------------------------------

    def train_step(self) -> None:
        cfg, runs = self.cfg, self.runs
        lrs = [get_lr(self.step, run.cfg) for run in runs]
        step = self.step + 1
        is_eval = step % cfg.eval_every == 0 or step == cfg.max_iters
        is_full = runs[0].is_full_eval(step)
        is_row = step % cfg.log_every == 0 or is_eval or is_full
        x, y = _stack([run.batches.next() for run in runs])
        with self.autocast():
            loss = stacked.losses(self.config, self.params, x, y)  # (S,)
        for i, run in enumerate(runs):
            run.batches.prefetch()
            if self.live[i]:
                run.losses.add(step, loss[i])
                if (is_row or run.losses.needs_first_loss) and not run.check_losses():
                    self.live[i] = False  # diverged: its record ends before this update
        loss.sum().backward()
        grad_norm = self.masked_clipped_gradients()
        if len(set(lrs)) == 1:
            for group in self.optimizer.param_groups:
                group["lr"] = lrs[0]
            self.optimizer.step()
        else:
            self.step_at_own_lrs(lrs)
        self.optimizer.zero_grad(set_to_none=True)
        self.restore_frozen()
        self.step = step
        for i, run in enumerate(runs):
            if self.live[i]:
                run.step = step
        if is_row:
            self.log_rows(step, lrs, loss, grad_norm, is_eval, is_full)

    @torch.no_grad()
    def step_at_own_lrs(self, lrs: list[float]) -> None:
        """One optimizer step in which run ``i`` moves at ``lrs[i]``: the step at the largest lr, each run's
        move scaled by its lr over that one. Exact up to rounding for the cases that train in lockstep
        (SGD, with momentum and weight decay, and AdamW): their move is ``lr`` times a direction (and a
        decay) that the lr does not change, and their state (momentum, moments) does not depend on it."""
        top = max(lrs)
        for group in self.optimizer.param_groups:
            group["lr"] = top
        before = [param.detach().clone() for param in self.params.values()]
        self.optimizer.step()
        scale = torch.tensor(lrs, dtype=before[0].dtype, device=before[0].device) / top  # (S,)
        for param, old in zip(self.params.values(), before, strict=True):
            move = param.detach() - old
            param.detach().copy_(old.add_(move.mul_(per_run(scale, old))))

    def masked_clipped_gradients(self) -> torch.Tensor:
        """Zero the gradients at fixed and frozen entries, clip each run's by its own norm (as
        clip_grad_norm_ does); each run's norm before clipping, (S,)."""
        params = list(self.params.values())
        for name, (mask, _) in self.frozen.items():
            grad = self.params[name].grad
            assert grad is not None  # every parameter takes part in the loss
            grad.masked_fill_(mask, 0.0)
        grads = [p.grad for p in params if p.grad is not None]
        norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads])  # (P, S)
        total = torch.linalg.vector_norm(norms, dim=0)  # (S,)
        clip = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        coef = torch.clamp(clip / (total + 1e-6), max=1.0)
        for grad in grads:
            grad.mul_(per_run(coef, grad))
        return total

    @torch.no_grad()
    def restore_frozen(self) -> None:
        for name, (mask, values) in self.frozen.items():
            self.params[name][mask] = values[mask]

    def finite(self, i: int) -> bool:
        """check_weights' test of run ``i``: its weights, and their squares in float64, finite."""
        norms = torch.stack(
            [torch.linalg.vector_norm(p[i].detach(), dtype=torch.float64) for p in self.params.values()]
        )
        return bool(torch.isfinite(norms.square().sum()))

    def log_rows(
        self,
        step: int,
        lrs: list[float],
        loss: torch.Tensor,
        grad_norm: torch.Tensor,
        is_eval: bool,
        is_full: bool,
    ) -> None:
        for i, run in enumerate(self.runs):
            if self.live[i] and not self.finite(i):
                self.live[i] = False
                if run.check_losses():  # no earlier loss was bad: this update is where the run diverged
                    run.status, run.diverged_step, run.diverged_loss = "diverged", step, math.inf
                    run.step = step - 1
                    say(
                        f"{run.out}: the update of step {step} at lr {lrs[i]:.4g} leaves non-finite weights: "
                        "run diverged"
                    )
        losses, norms = loss.tolist(), grad_norm.tolist()
        heads = [
            {"step": step, "lr": lrs[i], "train_loss": losses[i], "grad_norm": norms[i], "rebalanced": 0}
            for i in range(len(self.runs))
        ]
        tails: list[dict] = [{} for _ in self.runs]
        self.evaluate(tails, is_eval, is_full)
        for i, run in enumerate(self.runs):
            if self.live[i]:
                run.finish_row(heads[i], None, tails[i])
        live = [i for i, alive in enumerate(self.live) if alive]
        if live:
            self.runs[live[0]].report_progress(losses[live[0]], lrs[live[0]])

    def stop_if_requested(self, stop: StopSignals) -> int | None:
        """TrainingLoop.stop_if_requested for the group: the periodic checkpoint of every live run, or on a
        stop signal (or --stop-after) the checkpoints and the exit status."""
        cfg, step = self.cfg, self.step
        requested = stop.signum is not None or (cfg.stop_after is not None and step == cfg.stop_after)
        if step >= cfg.max_iters or not (requested or step % cfg.ckpt_every == 0):
            return None
        for i, run in enumerate(self.runs):  # never checkpoint a run that diverged since its last row
            if self.live[i] and not (run.check_losses() and self.finite(i)):
                self.live[i] = False
        self.write_back()
        for i, run in enumerate(self.runs):
            if self.live[i]:
                run.save_checkpoint()
        if not requested:
            return None
        signum = stop.signum if stop.signum is not None else signal.SIGTERM
        say(
            f"stopped by {signal.Signals(signum).name} after step {step}; checkpoints saved, rerun the same "
            f"command to resume"
        )
        return 128 + int(signum)

    def train(self) -> int:
        """Every step to the end, then each run finished (its checkpoint, metrics.csv, run.json); the exit
        status."""
        for run in self.runs:
            run.start_clocks()
        if self.step == 0:
            progress.stage("evaluating the initial models")
            self.log_initial_state()
        progress.stage(lambda: f"step {self.step}/{self.cfg.max_iters} of {len(self.runs)} runs in lockstep")
        with StopSignals() as stop:
            while self.step < self.cfg.max_iters and any(self.live):
                self.train_step()
                status = self.stop_if_requested(stop)
                if status is not None:
                    return status
        self.write_back()
        for run in self.runs:
            run.finish()
        return 0


def per_run(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``values`` (S,), one per run, shaped to scale ``like`` (S, ...) run by run."""
    return values.view(-1, *([1] * (like.dim() - 1)))


def _stack(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.stack([x for x, _ in pairs]), torch.stack([y for _, y in pairs])


def settings_key(run: Run) -> tuple:
    """What runs of one lockstep group share: every setting but the seed and the run directory, and the
    step they start from."""
    settings = {k: v for k, v in asdict(run.cfg).items() if k not in FREE_SETTINGS}
    return repr(sorted(settings.items())), run.step


def train_together(configs: list) -> int:
    """``attnid train-runs --lockstep``: each run set up as ``attnid train`` would, finished runs' outputs
    rewritten, then every group of runs with the same settings trained in lockstep; the exit status."""
    if configs and configs[0].device != "cpu" and not torch.cuda.is_initialized():
        gpu_slots.acquire_gpu_slot()
    groups: dict[tuple, list[Run]] = {}
    for cfg in configs:
        run = Run(cfg)
        checkpoint = run.load_checkpoint()
        if rundir.rewrite_if_finished(checkpoint, run.ckpt_path, run.out):
            continue
        run.build()
        why = why_not_lockstep(run)
        if why is not None:
            raise UserError(f"{cfg.out} cannot train in lockstep: {why}; leave out --lockstep")
        rundir.remove_outputs(run.out)
        if checkpoint is not None:
            run.resume(checkpoint)
        groups.setdefault(settings_key(run), []).append(run)
    started = time.time()
    for number, group in enumerate(groups.values(), start=1):
        say(f"lockstep group {number}/{len(groups)}: {len(group)} runs from step {group[0].step}")
        status = Lockstep(group).train()
        if status:
            return status
    if groups:
        say(f"{sum(len(g) for g in groups.values())} runs in {time.time() - started:.1f} s")
    return 0
