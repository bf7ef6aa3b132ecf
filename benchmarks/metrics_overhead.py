"""Cost of ρ β τ μ per log step, side by side with one training step, on nanoGPT's CPU config.

Model: 4 layers, 4 heads, E=128, block 64, batch 12 (the probe batch is one training
batch, as ``attnid train`` uses). Measured one after another in this process, with
the same threads:

1. ``train step``: forward, backward, AdamW step (random tokens; speed does not depend on them);
2. ``metrics``: what a log step adds: snapshot + step_metrics + state_metrics + tau_probe,
   and each part alone (tau_probe's two probe-batch forwards dominate).

Times are process CPU time (see ``CLOCK``). Prints ms for each and the ratio ``metrics / (log_every * train step)``: the
fraction of training time spent on metrics at ``--log-every`` (target <= 0.05).

    python benchmarks/metrics_overhead.py [--repeats 30] [--threads 1] [--log-every 10]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from attnid.metrics import MetricTracker
from attnid.model import GPT, GPTConfig


# CPU time of this process, not wall time: on a shared machine other jobs' load inflates
# wall time unevenly, while the work done here (with a fixed thread count) stays the same.
CLOCK = time.process_time


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = CLOCK()
        fn()
        times.append(1e3 * (CLOCK() - start))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    torch.manual_seed(1337)
    model = GPT(GPTConfig(block_size=64, vocab_size=65, n_layer=4, n_head=4, n_embd=128, dropout=0.0, bias=False))
    optimizer = torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    batch = (torch.randint(0, 65, (12, 64), generator=gen), torch.randint(0, 65, (12, 64), generator=gen))
    tracker = MetricTracker(model, probe_batch=batch)

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        _, loss = model(*batch)
        loss.backward()
        optimizer.step()

    pre = tracker.snapshot(model)
    train_step()
    parts = {
        "snapshot": lambda: tracker.snapshot(model),
        "step_metrics": lambda: tracker.step_metrics(model, pre),
        "state_metrics": lambda: tracker.state_metrics(model),
        "tau_probe": lambda: tracker.tau_probe(model),
        "probe forward (x1)": lambda: tracker._probe(model),
    }

    def all_metrics():
        snap = tracker.snapshot(model)
        tracker.step_metrics(model, snap)
        tracker.state_metrics(model)
        tracker.tau_probe(model)

    step_ms = median_ms(train_step, args.repeats)
    print(f"threads={args.threads}  train step: {step_ms:.2f} ms")
    for name, fn in parts.items():
        print(f"  {name:>20}: {median_ms(fn, args.repeats):7.2f} ms")
    metrics_ms = median_ms(all_metrics, args.repeats)
    maths_ms = metrics_ms - parts_ms_probe(parts, args.repeats)
    print(f"  {'all per log step':>20}: {metrics_ms:7.2f} ms  (of which maths, without tau's two forwards: "
          f"{maths_ms:.2f} ms)")
    print(f"overhead ratio metrics / ({args.log_every} train steps): {metrics_ms / (args.log_every * step_ms):.4f}"
          f"   (target <= 0.05)")


def parts_ms_probe(parts, repeats: int) -> float:
    return 2 * median_ms(parts["probe forward (x1)"], repeats)


if __name__ == "__main__":
    main()
