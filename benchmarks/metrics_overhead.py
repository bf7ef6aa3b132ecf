"""Cost of the metrics by part, side by side with training, on nanoGPT's CPU config or any size.

Model: by default 4 layers, 4 heads, E=128, block 64, batch 12, AdamW; ``--paper`` is
config/paper.yaml's model (6 layers, 6 heads, E=384, block 256, batch 64), and
``--n-layer`` ... ``--batch-size`` set any size. The probe batch has ``--probe-rows``
sequences (``attnid train`` uses 2).

One *round* is ``--log-every`` training steps (forward, backward, AdamW step), each followed by
what the metrics pipeline does after a step (docs/design.md §3.6), timed by part: the copy of the
attention weights, the float64 pairs, the drift split's products and sums; after the last step of
the round also what a row adds: the drift columns (with the post-step Gram matrices), ρ, β and μ
(μ's nuclear norm from the Grams), and the τ probe: its orbit move (the maths, which a metrics thread
makes), the copy of the model loaded, moved and measured by its two probe-batch forward passes, and the
clone of the weights outside attention that the training thread makes for a metrics thread's probe.
Rounds alternate with training, so both are measured under the same machine load; times are process
CPU time (other jobs on a shared machine inflate wall time unevenly). It prints the median cost of
each part and

    overhead = metrics of a round / (log_every training steps)      target <= 0.05

with a τ probe on every ``--tau-every``-th row (the pipeline's cost, whichever thread runs it).

    python benchmarks/metrics_overhead.py [--rounds 15] [--threads 1] [--log-every 10] [--tau-every 1]
                                          [--probe-rows 2] [--n-kv-head G] [--rope] [--paper]
                                          [--n-layer L] [--n-head H] [--n-embd E] [--block-size T]
                                          [--batch-size B]

The metric costs do not depend on the batch size (only the probe's two forwards depend on
the block size), so at the paper's size ``--batch-size 4 --log-every 1`` keeps the CPU
training steps short and still times the metrics of the paper's model.

``--n-kv-head`` / ``--rope`` measure an attention variant (docs/design.md §8) on its own orbit.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from attnid.measure import rebalancing
from attnid.measure.drift import DriftTracker
from attnid.measure.metrics import MetricTracker
from attnid.measure.products import Point, steps_between
from attnid.model.gpt import GPT, GPTConfig
from attnid.model.layout import attention_tensors, layout_of

CLOCK = time.process_time


def timed(fn) -> float:
    start = CLOCK()
    fn()
    return 1e3 * (CLOCK() - start)


def build_model(args) -> tuple[GPT, dict]:
    """The GPT of the size the flags ask for, and that size (with the batch size)."""
    size = (
        dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64)
        if args.paper
        else dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12)
    )
    size |= {key: value for key, value in vars(args).items() if key in size and value is not None}
    torch.manual_seed(1337)
    shape = {key: value for key, value in size.items() if key != "batch_size"}
    return GPT(
        GPTConfig(vocab_size=65, dropout=0.0, bias=False, n_kv_head=args.n_kv_head, rope=args.rope, **shape)
    ), size


PARTS = (
    "copy",
    "pairs",
    "step products",
    "drift sums",
    "drift columns",
    "rho",
    "beta, mu",
    "tau move",
    "tau forwards",
    "tau clone",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--tau-every", type=int, default=1, help="a tau probe on every N-th row (default 1)")
    parser.add_argument("--probe-rows", type=int, default=2)
    parser.add_argument(
        "--paper",
        action="store_true",
        help="config/paper.yaml's model: 6 layers, 6 heads, E=384, block 256, batch 64",
    )
    for flag, default in (
        ("--n-layer", 4),
        ("--n-head", 4),
        ("--n-embd", 128),
        ("--block-size", 64),
        ("--batch-size", 12),
    ):
        parser.add_argument(flag, type=int, default=None, help=f"(default {default}; --paper sets it)")
    parser.add_argument("--n-kv-head", type=int, default=None, help="key/value heads (GQA); default: 4, MHA")
    parser.add_argument("--rope", action="store_true", help="rotary embeddings (RoPE-restricted orbit)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, size = build_model(args)
    batch_size, block_size = size["batch_size"], size["block_size"]
    optimizer = torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    batch = (
        torch.randint(0, 65, (batch_size, block_size), generator=gen),
        torch.randint(0, 65, (batch_size, block_size), generator=gen),
    )
    tracker = MetricTracker(model, probe_batch=(batch[0][: args.probe_rows], batch[1][: args.probe_rows]))
    drift, layout = DriftTracker(model), layout_of(model)
    probe = rebalancing.ProbeCopy(model)
    tracker.rebalance_targets(rebalancing.PROBE_TARGET)  # prepared once per run

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        _, loss = model(*batch)
        loss.backward()
        optimizer.step()

    def copy_weights():
        tensors = attention_tensors(model)
        return [tuple(None if t is None else t.detach().clone() for t in layer) for layer in tensors]

    parts: dict[str, list[float]] = {k: [] for k in (*PARTS, "train step", "overhead")}
    last = Point(copy_weights(), layout)
    row_index = 0
    with torch.no_grad():
        for round_index in range(args.rounds + 1):  # round 0 warms up
            spent = dict.fromkeys(PARTS, 0.0)
            train_ms = []
            for _ in range(args.log_every):
                with torch.enable_grad():
                    train_ms.append(timed(train_step))
                kept = {}
                spent["copy"] += timed(lambda: kept.update(post=Point(copy_weights(), layout)))
                post = kept["post"]
                spent["pairs"] += timed(post.pairs)
                steps = steps_between(last.pairs(), post.pairs())
                spent["step products"] += timed(
                    lambda: [(s.cross_a, s.cross_b, s.step_gram_a, s.step_gram_b) for s in steps.values()]
                )
                spent["drift sums"] += timed(lambda: drift.add_step(steps, 1e-3))
                last = post
            spent["drift columns"] = timed(lambda: drift.row_at(post.pairs()))
            spent["rho"] = timed(lambda: tracker.step_row(steps))
            minima, probed = None, row_index % args.tau_every == 0
            if probed:
                pairs = {circuit: (p.pair_a, p.pair_b) for circuit, p in post.pairs().items()}
                kept = {}
                spent["tau move"] = timed(
                    lambda: kept.update(
                        moves=rebalancing.plan_moves(tracker, pairs, rebalancing.PROBE_TARGET)
                    )
                )
                minima = {circuit: move.minimum for circuit, move in kept["moves"].items()}
                others = probe.others(model, copy=False)
                spent["tau forwards"] = timed(
                    lambda: probe.measure(others, post.tensors, tracker, kept["moves"])
                )
                spent["tau clone"] = timed(lambda: probe.others(model, copy=True))
            spent["beta, mu"] = timed(lambda: tracker.state_row(post.pairs(), minima))
            row_index += 1
            if round_index == 0:
                continue
            for key in PARTS:
                if key.startswith("tau") and not probed:
                    continue  # the probe's parts: medians over the rounds that probed
                parts[key].append(spent[key])
            parts["train step"].append(statistics.median(train_ms))
            # the clone is made only when a metrics thread probes: not part of the synchronous pipeline's cost
            parts["overhead"].append((sum(spent.values()) - spent["tau clone"]) / sum(train_ms))
    median = {k: statistics.median(v) for k, v in parts.items()}
    print(
        f"n_layer={size['n_layer']} n_head={size['n_head']} n_embd={size['n_embd']} block={block_size} "
        f"batch={batch_size} n_kv_head={model.config.kv_heads} rope={args.rope} threads={args.threads} "
        f"log_every={args.log_every} tau_every={args.tau_every} probe_rows={args.probe_rows} "
        f"rounds={args.rounds} (medians over rounds, process CPU ms per round)"
    )
    print(f"  {'train step':>24}: {median['train step']:8.2f}")
    for key in PARTS:
        note = " (rows with a probe)" if key.startswith("tau") else ""
        if key == "tau clone":
            note = " (rows with a probe; the training thread's, with a metrics thread; not in the overhead)"
        print(f"  {key:>24}: {median[key]:8.2f}{note}")
    per_step = sum(median[k] for k in PARTS[:4])
    print(f"  {'every step, per step':>24}: {per_step / args.log_every:8.2f}")
    row = sum(median[k] for k in PARTS[4:7])
    print(
        f"  {'a row, beyond its step':>24}: {row:8.2f}   (+ the probe's parts on probed rows, where "
        f"mu reuses the probe's minimum)"
    )
    print(f"overhead = metrics / ({args.log_every} train steps): {median['overhead']:.4f}   (target <= 0.05)")


if __name__ == "__main__":
    main()
