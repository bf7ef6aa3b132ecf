"""The linear algebra of a log step, new / old, measured side by side in one run, at the paper's model size.

*Old* is the metrics code before the shared products (kept here as reference functions, the only
place it still exists): a float64 snapshot before each step and the drift split after it; on a log
step ρ from its own Gram matrices and cross products, the drift columns, τ by a probe rebalance of
the live model (weights restored) and β, μ with μ's nuclear norm from thin QRs of ``Aᵀ`` and ``Bᵀ``.
*New* is what ``attnid train`` runs: :class:`attnid.training.metrics_pipeline.MetricsPipeline` (on the
training thread here, ``threads=0``), one copy of the post-step weights per step and every
``D x D`` product computed once (docs/design.md §3.6), τ on every ``--tau-every``-th row.

Each repetition trains two AdamW steps of the model (not timed): after the first, a log step, every
implementation measures its row on the same weights (order alternating between repetitions); after
the second, a plain step, the per-step work only. τ's two probe-batch forward passes are left out
(they are the same in both, and not linear algebra; ``--with-forwards`` keeps them). Times are this
thread's CPU time (``--clock cpu``, the default: other jobs on a shared machine do not count; the
maths runs on this thread with ``--threads 1``) or wall time. It prints the medians over repetitions
and

    log-step linear algebra, new / old   = (new row - new plain step) / (old row - old plain step)
                                           target <= 0.33 at paper.yaml's --tau-every 10

where a new row is ``(1/N) x`` a row with τ ``+ (1 - 1/N) x`` a row without (``N = --tau-every``); also
at ``N = 1`` (τ on every row, as before: the maths alone) and the per-step work, new / old.

    python benchmarks/logstep_maths.py [--reps 15] [--tau-every 10] [--threads 1] [--clock cpu|wall]
                                       [--with-forwards] [--n-layer L] [--n-head H] [--n-embd E]
                                       [--n-kv-head G] [--block-size T]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from attnid.measure import rebalancing
from attnid.measure.drift import DriftTracker
from attnid.measure.metrics import MetricTracker, excess_norm
from attnid.model import moves
from attnid.model.gpt import GPT, GPTConfig
from attnid.model.layout import stacked_pairs
from attnid.theory import factor_pairs
from attnid.theory.circuits import CIRCUITS
from attnid.training.metrics_pipeline import MetricsPipeline, RowRequest

PAPER = dict(n_layer=6, n_head=6, n_embd=384, block_size=256)


# --------------------------------------------------------------------------------------
# The old implementation (reference only)
# --------------------------------------------------------------------------------------


def old_unidentified_sq_norm(pair_a, pair_b, step_a, step_b):
    """ρ's numerator as before: its own Grams and right-hand side, two eigendecompositions."""
    eig_a, vec_a = torch.linalg.eigh(factor_pairs.gram(pair_a))
    eig_b, vec_b = torch.linalg.eigh(factor_pairs.gram(pair_b))
    eig_a, eig_b = eig_a.clamp_min(0), eig_b.clamp_min(0)
    rhs = step_a @ pair_a.transpose(-1, -2) - pair_b @ step_b.transpose(-1, -2)
    rhs_eig = vec_b.transpose(-1, -2) @ rhs @ vec_a
    denom = eig_b.unsqueeze(-1) + eig_a.unsqueeze(-2)
    scale = torch.maximum(eig_a.amax(-1), eig_b.amax(-1)).unsqueeze(-1).unsqueeze(-1)
    solvable = denom > factor_pairs.SINGULAR_RTOL * scale
    safe = torch.where(solvable, denom, torch.ones_like(denom))
    inv_denom = torch.where(solvable, 1 / safe, torch.zeros_like(denom))
    return (rhs_eig.square() * inv_denom).sum((-1, -2)), ~solvable.flatten(-2).all(-1)


def old_excess_norm_terms(pair_a, pair_b):
    """μ's two sums as before: ``2 ||A^T B||_*`` from thin QRs of ``A^T`` and ``B^T`` and a D x D SVD."""
    frobenius_sq = pair_a.square().sum((-1, -2)) + pair_b.square().sum((-1, -2))
    r_a = torch.linalg.qr(pair_a.transpose(-1, -2), mode="r")[1]
    r_b = torch.linalg.qr(pair_b.transpose(-1, -2), mode="r")[1]
    return frobenius_sq, 2 * torch.linalg.svdvals(r_a @ r_b.transpose(-1, -2)).sum(-1)


def per_layer_sums(values, n_layer):
    return values.reshape(n_layer, -1).sum(-1)


@torch.no_grad()
def old_step_metrics(tracker, model, pre) -> dict:
    now = tracker.read(model)
    row, singular_pairs = {}, 0
    for circuit in CIRCUITS:
        pre_a, pre_b = stacked_pairs(pre, tracker.layout, circuit)
        now_a, now_b = stacked_pairs(now, tracker.layout, circuit)
        step_a, step_b = now_a - pre_a, now_b - pre_b
        proj_sq, singular = old_unidentified_sq_norm(pre_a, pre_b, step_a, step_b)
        proj_sq = per_layer_sums(proj_sq, tracker.n_layer).tolist()
        step_sq = step_a.square().sum((-1, -2)) + step_b.square().sum((-1, -2))
        step_sq = per_layer_sums(step_sq, tracker.n_layer).tolist()
        row[f"rho_{circuit}"] = sum(proj_sq) / sum(step_sq)
        for layer in range(tracker.n_layer):
            row[f"rho_{circuit}_l{layer}"] = proj_sq[layer] / step_sq[layer]
        singular_pairs += int(singular.sum())
    row["rho_singular_pairs"] = singular_pairs
    return row


@torch.no_grad()
def old_state_metrics(tracker, model, last_moves) -> dict:
    now = tracker.read(model)
    row = {}
    for circuit, orbit in tracker.orbits.items():
        pair_a, pair_b = stacked_pairs(now, tracker.layout, circuit)
        drift = orbit.conserved_imbalance(pair_a, pair_b) - tracker.initial_imbalance[circuit]
        drift_sq = per_layer_sums(drift.square().sum((-1, -2)), tracker.n_layer).tolist()
        norm_sq = tracker.beta_norm_sq[circuit].tolist()
        row[f"beta_{circuit}"] = math.sqrt(sum(drift_sq)) / math.sqrt(sum(norm_sq))
        for layer in range(tracker.n_layer):
            row[f"beta_{circuit}_l{layer}"] = math.sqrt(drift_sq[layer]) / math.sqrt(norm_sq[layer])
        move = last_moves.pop(circuit, None)
        same_weights = (
            move is not None and torch.equal(move.pair_a, pair_a) and torch.equal(move.pair_b, pair_b)
        )
        if same_weights:
            frobenius_sq = pair_a.square().sum((-1, -2)) + pair_b.square().sum((-1, -2))
            minimum = move.minimum
        else:
            frobenius_sq, minimum = old_excess_norm_terms(pair_a, pair_b)
        row[f"mu_{circuit}"] = excess_norm(frobenius_sq, minimum)
        chunks = zip(frobenius_sq.chunk(tracker.n_layer), minimum.chunk(tracker.n_layer))
        for layer, (frob, low) in enumerate(chunks):
            row[f"mu_{circuit}_l{layer}"] = excess_norm(frob, low)
    return row


@torch.no_grad()
def old_log_row(tracker, drift, model, pre) -> dict:
    """The old log step: ρ, the drift columns, τ by a probe of the live model (restored), β and μ."""
    row = old_step_metrics(tracker, model, pre) | drift.row(model)
    with moves.kept_attention_weights(model):
        tau_columns, moved = rebalancing.move_and_measure(model, tracker)
    return row | tau_columns | old_state_metrics(tracker, model, moved)


# --------------------------------------------------------------------------------------
# The measurement
# --------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15, help="repetitions (two training steps each)")
    parser.add_argument("--tau-every", type=int, default=10, help="the new tau cadence (paper.yaml: 10)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--with-forwards", action="store_true", help="time tau's probe forward passes too")
    for flag in ("--n-layer", "--n-head", "--n-embd", "--block-size"):
        parser.add_argument(flag, type=int, default=PAPER[flag[2:].replace("-", "_")])
    parser.add_argument("--n-kv-head", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    torch.manual_seed(1337)
    shape = dict(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=args.block_size)
    model = GPT(GPTConfig(vocab_size=65, dropout=0.0, bias=False, n_kv_head=args.n_kv_head, **shape))
    optimizer = torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    batch = (
        torch.randint(0, 65, (1, args.block_size), generator=gen),
        torch.randint(0, 65, (1, args.block_size), generator=gen),
    )
    probe_batch = (batch[0][:1], batch[1][:1])

    def trackers():
        tracker = MetricTracker(model, probe_batch=probe_batch)
        if not args.with_forwards:
            fixed = tracker.probe(model)
            tracker.probe = lambda probed: fixed  # the forward passes are not linear algebra
        return tracker, DriftTracker(model)

    old_tracker, old_drift = trackers()
    news = {}
    for name in ("tau", "plain"):  # one pipeline measures rows with tau, one rows without
        tracker, drift = trackers()
        news[name] = MetricsPipeline(
            model, tracker, drift, threads=0, queue_steps=1, tf32_training=False, probes=True
        )
        news[name].restart(model, 0)

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        _, loss = model(*batch)
        loss.backward()
        optimizer.step()

    def timed(fn) -> float:
        start = clock()
        fn()
        return 1e3 * (clock() - start)

    times: dict[str, list[float]] = {
        k: [] for k in ("old row", "old step", "new row with tau", "new row without tau", "new step")
    }
    step = 0
    for rep in range(args.reps + 1):  # repetition 0 warms up
        for log_step in (True, False):
            step += 1
            kept = {}
            old_before = timed(lambda: kept.update(pre=old_drift.before_step(model)))
            train_step()
            measured = {}

            def old():
                pre = kept["pre"]
                measured["old"] = old_before + timed(lambda: old_drift.after_step(model, lr=1e-3))
                if log_step:
                    measured["old row"] = timed(lambda: old_log_row(old_tracker, old_drift, model, pre))

            def new():
                for name, pipeline in news.items():
                    request = RowRequest(tau=name == "tau") if log_step else None
                    measured[name] = timed(lambda: pipeline.after_step(model, step, 1e-3, request))

            for part in (old, new) if rep % 2 else (new, old):
                part()
            if rep == 0:
                continue
            if log_step:
                times["old row"].append(measured["old"] + measured["old row"])
                times["new row with tau"].append(measured["tau"])
                times["new row without tau"].append(measured["plain"])
            else:
                times["old step"].append(measured["old"])
                times["new step"].append(statistics.mean([measured["tau"], measured["plain"]]))

    median = {k: statistics.median(v) for k, v in times.items()}
    old_la = median["old row"] - median["old step"]

    def new_la(tau_every: int) -> float:
        share = 1 / tau_every
        row = share * median["new row with tau"] + (1 - share) * median["new row without tau"]
        return row - median["new step"]

    print(
        f"n_layer={args.n_layer} n_head={args.n_head} n_embd={args.n_embd} "
        f"n_kv_head={model.config.kv_heads} "
        f"block={args.block_size} threads={args.threads} reps={args.reps} clock={args.clock} "
        f"forwards={'in' if args.with_forwards else 'out'} (medians, ms)"
    )
    for key, value in median.items():
        print(f"  {key:>24}: {value:8.1f}   (spread {min(times[key]):.1f}-{max(times[key]):.1f})")
    print(f"  {'old log-step maths':>24}: {old_la:8.1f}   (tau on every row)")
    for tau_every in sorted({1, args.tau_every}):
        print(f"  {f'new, tau every {tau_every}':>24}: {new_la(tau_every):8.1f}")
    ratio = new_la(args.tau_every) / old_la
    print(f"log-step linear algebra, new / old, tau every {args.tau_every}: {ratio:.3f}   (target <= 0.33)")
    if args.tau_every != 1:
        print(f"log-step linear algebra, new / old, tau every row:  {new_la(1) / old_la:.3f}")
    print(f"per-step work (drift split), new / old:          {median['new step'] / median['old step']:.3f}")


if __name__ == "__main__":
    main()
