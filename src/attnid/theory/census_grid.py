"""The theory stage's census grid (table A5): tiny shapes over every axis, hand-picked and drawn at
random from the closed forms' domain, each measured by :func:`attnid.theory.census.census`
(docs/theory.md, "census.csv")."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from attnid.theory import whole_model as theory
from attnid.theory.census import CENSUS_ROPE_BASE, census, measurable

if TYPE_CHECKING:
    import pandas as pd


def hand_picked_shapes() -> list[theory.WholeModelShape]:
    """Tiny shapes over every axis: layers, heads, width, biases, tying, norm, GQA, RoPE, MLP, block
    size, vocabularies below and above the width, a first layer that sees less than the stream, epsilon."""
    s = theory.whole_model_shape
    # keyword arguments of whole_model_shape, splatted into it
    nanogpt: dict[str, Any] = {"n_embd": 8, "n_head": 2, "block_size": 4, "mlp_hidden": 8}
    biases: dict[str, Any] = {"norm_bias": True, "qkv_bias": True, "mlp_bias": True}  # nanoGPT's bias=True
    llama: dict[str, Any] = {
        "norm": "rmsnorm",
        "mlp": "swiglu",
        "tied": False,
        "positions": "rope",
        "mlp_hidden": 12,
    }
    small: dict[str, Any] = {"n_embd": 8, "n_head": 2, "block_size": 4}
    llama_learned = llama | {"positions": "learned", "mlp_hidden": 6}
    llama_narrow = llama | {"mlp_hidden": 6}
    return [
        # nanoGPT (attnid train's model): LayerNorm, GELU, tied, learned positions; then the F = 4E
        s(1, vocab_size=12, **nanogpt),
        s(1, vocab_size=12, **{**nanogpt, "mlp_hidden": 32}),
        s(2, vocab_size=10, **nanogpt),
        s(1, vocab_size=12, **biases, **nanogpt),
        s(2, n_embd=6, n_head=2, vocab_size=8, block_size=4, mlp_hidden=6, **biases),
        s(1, vocab_size=12, tied=False, **nanogpt),
        s(1, vocab_size=12, tied=False, **biases, **nanogpt),
        s(1, n_embd=9, n_head=3, vocab_size=14, block_size=3, mlp_hidden=12),
        # one head as wide as the stream; GQA; model.py's rope variant; the residual scaling made exact
        s(1, n_embd=8, n_head=1, vocab_size=12, block_size=4, mlp_hidden=8),
        s(1, n_embd=8, n_head=4, n_kv_head=2, vocab_size=12, block_size=4, mlp_hidden=8),
        s(1, n_embd=8, n_head=2, vocab_size=12, block_size=5, mlp_hidden=8, positions="rope"),
        s(1, vocab_size=12, norm_eps=0.0, **nanogpt),
        # vocabularies below the width: tied, part of the stream rotation survives; biases reach log-softmax
        s(1, vocab_size=6, **nanogpt),
        s(1, vocab_size=5, block_size=5, n_embd=8, n_head=2, mlp_hidden=8),
        s(1, vocab_size=6, **biases, **nanogpt),
        s(1, vocab_size=6, tied=False, **nanogpt),
        # embeddings spanning less than the stream (V + T - 1 < E, as nanoGPT shakespeare-char)
        s(1, n_embd=12, n_head=2, vocab_size=7, block_size=4, mlp_hidden=8),
        s(1, n_embd=10, n_head=2, vocab_size=6, block_size=4, **llama_learned),
        # a LayerNorm bias without linear biases; q/k/v biases without an output bias
        s(1, vocab_size=12, norm_bias=True, **nanogpt),
        s(1, vocab_size=12, qkv_bias=True, out_bias=False, **nanogpt),
        # Llama family: RMSNorm, RoPE, SwiGLU, untied, GQA; Qwen2 (q/k/v biases); Gemma (tied, GeGLU)
        s(1, vocab_size=12, **small, **llama),
        s(2, n_embd=6, n_head=4, n_kv_head=2, head_dim=2, vocab_size=9, block_size=4, **llama_narrow),
        s(1, vocab_size=12, qkv_bias=True, out_bias=False, **small, **llama),
        s(1, vocab_size=12, **small, **{**llama, "tied": True, "mlp": "geglu"}),
        s(1, vocab_size=6, **small, **{**llama, "positions": "learned", "tied": True}),
        s(1, vocab_size=12, norm_eps=0.0, **small, **llama),
        # parallel blocks: Falcon (multi-query, RoPE, LayerNorm with a bias, no linear biases), all biases
        s(
            1,
            **small,
            n_kv_head=1,
            vocab_size=24,
            mlp_hidden=6,
            norm_bias=True,
            positions="rope",
            block="parallel",
        ),
        s(1, **small, vocab_size=8, mlp_hidden=6, **biases, block="parallel"),
    ]


def random_shapes(count: int, seed: int = 0, max_params: int = 900) -> list[theory.WholeModelShape]:
    """``count`` shapes drawn at random from the closed forms' domain (every option, tiny sizes), so the
    grid holds shapes that nobody picked: a rejected draw (outside the domain, too large or with too small
    an input domain to measure) is drawn again."""
    import random

    rng = random.Random(seed)
    shapes: list[theory.WholeModelShape] = []
    while len(shapes) < count:
        n_embd = rng.choice([6, 7, 8, 9, 10])
        n_kv_head = rng.choice([1, 2])
        positions = rng.choice(["learned", "learned", "rope", "none"])
        norm = rng.choice(theory.NORMS)
        options: dict[str, Any] = dict(
            n_embd=n_embd,
            n_head=n_kv_head * rng.choice([1, 2, 3]),
            n_kv_head=n_kv_head,
            head_dim=rng.choice([2, 4]) if positions == "rope" else rng.choice([2, 3, 4]),
            vocab_size=rng.choice([n_embd - 2, n_embd - 1, n_embd, n_embd + 1, n_embd + 3, 2 * n_embd]),
            block_size=rng.choice([3, 4, 5]),
            norm=norm,
            norm_bias=norm == "layernorm" and rng.random() < 0.5,
            qkv_bias=rng.random() < 0.4,
            out_bias=rng.random() < 0.5,
            mlp=rng.choice(theory.MLPS),
            mlp_hidden=rng.choice([4, 6, 8, 12]),
            mlp_bias=rng.random() < 0.4,
            tied=rng.random() < 0.5,
            positions=positions,
            block="parallel" if rng.random() < 0.15 else "sequential",
            norm_eps=0.0 if rng.random() < 0.15 else theory.DEFAULT_NORM_EPS,
        )
        try:
            shape = theory.whole_model_shape(rng.choice([1, 1, 2]), **options)
            measurable(shape, max_params)
        except ValueError:
            continue
        shapes.append(shape)
    return shapes


RANDOM_SHAPES, RANDOM_SEED = 8, 0


def default_grid(random_count: int = RANDOM_SHAPES, seed: int = RANDOM_SEED) -> list[theory.WholeModelShape]:
    """The theory stage's grid: the hand-picked shapes, then ``random_count`` random ones."""
    return hand_picked_shapes() + random_shapes(random_count, seed)


def run_grid(
    shapes: list[theory.WholeModelShape],
    progress: Callable[[str], None] | None = None,
    rope_base: float = CENSUS_ROPE_BASE,
) -> pd.DataFrame:
    import pandas as pd

    rows = []
    for shape in shapes:
        start = time.perf_counter()
        row = census(shape, rope_base=rope_base)
        rows.append(row)
        if progress is not None:
            status = "ok" if row["closes"] else "FAIL"
            progress(
                f"{status:4s} {row['shape']}: theory {row['theory']}, measured {row['measured']} of "
                f"{row['n_params']}, gap {row['gap']:.1e} ({time.perf_counter() - start:.1f} s)"
            )
    return pd.DataFrame(rows)
