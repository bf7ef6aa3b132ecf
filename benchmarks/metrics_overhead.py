"""Cost of ρ β τ μ per log step, side by side with training, on nanoGPT's CPU config.

Model: by default 4 layers, 4 heads, E=128, block 64, batch 12, AdamW; ``--paper`` is
config/paper.yaml's model (6 layers, 6 heads, E=384, block 256, batch 64), and
``--n-layer`` ... ``--batch-size`` set any size. The probe batch has ``--probe-rows``
sequences (``attnid train`` uses 2).

One *round* is ``--log-every`` training steps (forward, backward, AdamW step) and
then what a log step adds: snapshot + step_metrics + state_metrics + tau_probe.
Rounds alternate, so the two are measured under the same machine load; times are
process CPU time (other jobs on a shared machine inflate wall time unevenly). It
prints the median over rounds of

    overhead = metrics per log step / (log_every * training step)     target <= 0.05

and the median cost of each part, with tau_probe split into its two probe-batch
forwards and its maths.

    python benchmarks/metrics_overhead.py [--rounds 15] [--threads 1] [--log-every 10] [--probe-rows 2]
                                          [--n-kv-head G] [--rope] [--paper] [--n-layer L] [--n-head H]
                                          [--n-embd E] [--block-size T] [--batch-size B]

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
from attnid.measure.metrics import MetricTracker
from attnid.model.gpt import GPT, GPTConfig

CLOCK = time.process_time


def timed(fn) -> float:
    start = CLOCK()
    fn()
    return 1e3 * (CLOCK() - start)


def build_model(args) -> tuple[GPT, dict]:
    """The GPT of the size the flags ask for, and that size (with the batch size)."""
    size = dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64) if args.paper else \
        dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12)
    size |= {key: value for key, value in vars(args).items() if key in size and value is not None}
    torch.manual_seed(1337)
    shape = {key: value for key, value in size.items() if key != "batch_size"}
    return GPT(GPTConfig(vocab_size=65, dropout=0.0, bias=False, n_kv_head=args.n_kv_head, rope=args.rope,
                         **shape)), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--probe-rows", type=int, default=2)
    parser.add_argument("--paper", action="store_true", help="config/paper.yaml's model: 6 layers, 6 heads, E=384, "
                                                             "block 256, batch 64")
    for flag, default in (("--n-layer", 4), ("--n-head", 4), ("--n-embd", 128), ("--block-size", 64),
                          ("--batch-size", 12)):
        parser.add_argument(flag, type=int, default=None, help=f"(default {default}; --paper sets it)")
    parser.add_argument("--n-kv-head", type=int, default=None, help="key/value heads (GQA); default: 4, MHA")
    parser.add_argument("--rope", action="store_true", help="rotary embeddings (RoPE-restricted query-key orbit)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, size = build_model(args)
    batch_size, block_size = size["batch_size"], size["block_size"]
    optimizer = torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    batch = (torch.randint(0, 65, (batch_size, block_size), generator=gen),
             torch.randint(0, 65, (batch_size, block_size), generator=gen))
    tracker = MetricTracker(model, probe_batch=(batch[0][:args.probe_rows], batch[1][:args.probe_rows]))

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        _, loss = model(*batch)
        loss.backward()
        optimizer.step()

    parts: dict[str, list[float]] = {k: [] for k in ("snapshot", "step_metrics", "state_metrics", "tau_probe",
                                                     "probe forward x2", "train step", "overhead")}
    for round_index in range(args.rounds + 1):  # round 0 warms up
        train_ms = [timed(train_step) for _ in range(args.log_every - 1)]
        snap = {}
        snapshot_ms = timed(lambda: snap.setdefault("pre", tracker.snapshot(model)))
        train_ms.append(timed(train_step))
        step_ms = timed(lambda: tracker.step_metrics(model, snap["pre"]))
        tau_ms = timed(lambda: rebalancing.tau_probe(model, tracker))
        state_ms = timed(lambda: tracker.state_metrics(model))
        forwards_ms = timed(lambda: (tracker.probe(model), tracker.probe(model)))
        if round_index == 0:
            continue
        metrics_ms = snapshot_ms + step_ms + tau_ms + state_ms
        for key, value in [("snapshot", snapshot_ms), ("step_metrics", step_ms), ("state_metrics", state_ms),
                           ("tau_probe", tau_ms), ("probe forward x2", forwards_ms),
                           ("train step", statistics.median(train_ms)),
                           ("overhead", metrics_ms / sum(train_ms))]:
            parts[key].append(value)

    median = {k: statistics.median(v) for k, v in parts.items()}
    print(f"n_layer={size['n_layer']} n_head={size['n_head']} n_embd={size['n_embd']} block={block_size} "
          f"batch={batch_size} n_kv_head={model.config.kv_heads} rope={args.rope} threads={args.threads} "
          f"log_every={args.log_every} "
          f"probe_rows={args.probe_rows} rounds={args.rounds} (medians, process CPU ms)")
    print(f"  {'train step':>24}: {median['train step']:8.2f}")
    for key in ("snapshot", "step_metrics", "state_metrics", "tau_probe", "probe forward x2"):
        print(f"  {key:>24}: {median[key]:8.2f}")
    maths = median["snapshot"] + median["step_metrics"] + median["state_metrics"] + median["tau_probe"] \
        - median["probe forward x2"]
    print(f"  {'maths (all but forwards)':>24}: {maths:8.2f}   = {maths / median['train step']:.2f} train steps")
    metrics_ms = sum(median[k] for k in ("snapshot", "step_metrics", "state_metrics", "tau_probe"))
    print(f"  {'metrics per log step':>24}: {metrics_ms:8.2f}")
    print(f"  {'ms/step, all metrics':>24}: {median['train step'] + metrics_ms:8.2f}   (a step that logs)")
    print(f"  {'ms/step, averaged':>24}: {median['train step'] + metrics_ms / args.log_every:8.2f}   "
          f"(one log step in {args.log_every})")
    print(f"overhead = metrics / ({args.log_every} train steps): {median['overhead']:.4f}   (target <= 0.05)")


if __name__ == "__main__":
    main()
