"""Check every closed form of counts.py against the numerical nullity of a Jacobian.

For a small random instance of a layer, the map ``parameters -> outputs on
several random input sequences`` is differentiated with ``torch.func.jacfwd``
in float64. Its rank is read off the singular values with a relative threshold;
``measured = n_params - rank`` is the number of parameter directions the outputs
cannot see. With enough input rows the rank saturates at its generic value, so
``measured`` must equal the closed form (``theory``). ``gap`` is the ratio of the
smallest kept to the largest dropped singular value: a row passes only when
``theory == measured`` and ``gap >= 1e6``, i.e. the rank is unambiguous.

The layer here is written out independently of model.py (so the check does not
inherit that file's conventions): nanoGPT's causal attention with separate
``W_Q (HD x E)``, ``W_K (GD x E)``, ``W_V (GC x E)``, ``W_O (E x HC)``,
optional biases, GQA (query head ``h`` uses key/value group ``h // (H/G)``),
and RoPE with interleaved (GPT-J, RoFormer) or half-split (GPT-NeoX, Llama)
pairing (the rotation itself is model.py's ``rope_rotate``, so these checks cover
the RoPE the model runs). RoPE cases use base 10 rather than 10,000: the theory holds for any
distinct nonzero frequencies, and short random sequences would barely rotate
the slow planes of base 10,000, blurring the rank. The ``single_head`` case is the
paper's §4.10 single head: ``W_Q``, ``W_K``, ``W_V`` all ``E x E`` and no ``W_O``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from attnid.theory import counts
from attnid.theory.rope import rope_rotate  # the model's rotation: the checks test the RoPE it runs

if TYPE_CHECKING:
    import pandas as pd

GAP_REQUIRED = 1e6
RANK_RTOL = 1e-9  # singular values below RANK_RTOL * s_max count as zero
ROW_FACTOR = 3  # at least this many output rows per parameter, so the rank saturates


@dataclass(frozen=True)
class NullityCase:
    """One verification instance: a bare factor pair or a full attention layer."""

    name: str
    kind: str  # "pair", "attention" (plain MHA, no bias/RoPE), "attention_bias", "gqa", "rope", ...
    n_embd: int
    n_head: int = 1
    n_kv_head: int | None = None
    head_dim: int | None = None
    value_dim: int | None = None
    rope: str | None = None  # None, "interleaved" or "half"
    bias: bool = False
    out_bias: bool | None = None
    seq_len: int = 6

    def pair_dim(self) -> int:
        """``D`` of a ``pair`` case (its ``head_dim``, which a pair case must name)."""
        if self.head_dim is None:
            raise ValueError(f"{self.name}: a pair case needs head_dim")
        return self.head_dim

    def shape(self) -> counts.LayerShape:
        return counts.layer_shape(
            self.n_embd,
            self.n_head,
            self.n_kv_head,
            self.head_dim,
            self.value_dim,
            self.rope is not None,
            self.bias,
            self.out_bias,
        )


def default_cases() -> list[NullityCase]:
    """The verification suite: every formula, every flag, small enough for < 1 minute on one core."""
    single_head = NullityCase(
        "single head of the paper, Q K V without output projection, E=6", "single_head", n_embd=6
    )
    return pair_cases() + attention_cases() + gqa_cases() + rope_cases() + [single_head]


def pair_cases() -> list[NullityCase]:
    """One factor pair below, at and above the embedding (Lemma 4.1, 4.3, Cor. 4.4)."""
    return [
        NullityCase("pair D<E (D=3, E=5)", "pair", n_embd=5, head_dim=3),
        NullityCase("pair D=E (D=4, E=4)", "pair", n_embd=4, head_dim=4),
        NullityCase("pair D>E (D=5, E=3)", "pair", n_embd=3, head_dim=5),
    ]


def attention_cases() -> list[NullityCase]:
    """Plain multi-head attention over the head counts (T3), and with biases (T4, §4.7)."""
    cases = [
        NullityCase(f"attention E=12 H={n_head}", "attention", n_embd=12, n_head=n_head)
        for n_head in (1, 2, 3, 4, 6, 12)
    ]
    cases += [
        NullityCase(f"attention+bias E=12 H={n_head}", "attention_bias", n_embd=12, n_head=n_head, bias=True)
        for n_head in (1, 2, 3, 4)
    ]
    wide: dict[str, Any] = {"n_embd": 8, "n_head": 2, "head_dim": 3, "value_dim": 5, "bias": True}
    return cases + [
        NullityCase(
            "attention+qkv bias, no out bias E=12 H=3",
            "attention_bias",
            n_embd=12,
            n_head=3,
            bias=True,
            out_bias=False,
        ),
        NullityCase(
            "attention+qkv bias, no out bias, wide values E=8 H=2 D=3 C=5",
            "attention_bias",
            out_bias=False,
            **wide,
        ),
        NullityCase("attention+bias E=8 H=2 D=3 C=5", "attention_bias", **wide),
    ]


def gqa_cases() -> list[NullityCase]:
    """Grouped-query attention (T5, §4.9), with and without biases."""
    cases = [
        NullityCase(f"GQA E=12 H=4 G={n_kv_head} D=3", "gqa", n_embd=12, n_head=4, n_kv_head=n_kv_head)
        for n_kv_head in (1, 2, 4)
    ]
    return cases + [
        NullityCase("GQA+bias E=12 H=4 G=2 D=3", "gqa_bias", n_embd=12, n_head=4, n_kv_head=2, bias=True)
    ]


def rope_cases() -> list[NullityCase]:
    """RoPE's commutant (Prop. 4.8) in both pairings, with GQA and with biases (T4, T5)."""
    cases = [
        NullityCase(f"RoPE {pairing} E=12 H=3", "rope", n_embd=12, n_head=3, rope=pairing)
        for pairing in ("interleaved", "half")
    ]
    cases.append(NullityCase("RoPE interleaved E=8 H=1 D=8", "rope", n_embd=8, n_head=1, rope="interleaved"))
    cases += [
        NullityCase(
            f"RoPE {pairing}+GQA E=16 H=4 G=2", "rope_gqa", n_embd=16, n_head=4, n_kv_head=2, rope=pairing
        )
        for pairing in ("interleaved", "half")
    ]
    cases.append(
        NullityCase("RoPE half+GQA E=16 H=4 G=1", "rope_gqa", n_embd=16, n_head=4, n_kv_head=1, rope="half")
    )
    cases += [
        NullityCase(
            f"RoPE {pairing}+bias E=12 H=3", "rope_bias", n_embd=12, n_head=3, rope=pairing, bias=True
        )
        for pairing in ("interleaved", "half")
    ]
    cases.append(
        NullityCase(
            "RoPE half+GQA+qkv bias, no out bias (Qwen2-like) E=16 H=4 G=2",
            "rope_gqa_bias",
            n_embd=16,
            n_head=4,
            n_kv_head=2,
            rope="half",
            bias=True,
            out_bias=False,
        )
    )
    return cases


def theory_nullity(case: NullityCase) -> int:
    """The closed form from counts.py that the case checks."""
    if case.kind == "pair":
        return counts.factor_pair_nullity(case.pair_dim(), case.n_embd, case.n_embd)
    if case.kind == "single_head":
        return counts.single_head_unidentified_params(case.n_embd)
    return counts.unidentified_params_per_layer(case.shape())


# ---------------------------------------------------------------------------------------------
# The maps whose Jacobians are measured


def parameter_shapes(case: NullityCase) -> dict[str, tuple[int, ...]]:
    if case.kind == "pair":
        return {"A": (case.pair_dim(), case.n_embd), "B": (case.pair_dim(), case.n_embd)}
    if case.kind == "single_head":  # docs/design.md §10: 3 E^2 parameters
        return {name: (case.n_embd, case.n_embd) for name in ("w_q", "w_k", "w_v")}
    s = case.shape()
    e, h, g, d, c = s.n_embd, s.n_head, s.n_kv_head, s.head_dim, s.value_dim
    shapes: dict[str, tuple[int, ...]] = {
        "w_q": (h * d, e),
        "w_k": (g * d, e),
        "w_v": (g * c, e),
        "w_o": (e, h * c),
    }
    if s.bias:
        shapes.update({"b_q": (h * d,), "b_k": (g * d,), "b_v": (g * c,)})
    if s.out_bias:
        shapes["b_o"] = (e,)
    return shapes


def unflatten(flat: torch.Tensor, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    sizes = [math.prod(shape) for shape in shapes.values()]
    return {
        name: piece.reshape(shape) for (name, shape), piece in zip(shapes.items(), torch.split(flat, sizes))
    }


def attention_layer(
    x: torch.Tensor,
    p: dict[str, torch.Tensor],
    shape: counts.LayerShape,
    rope: str | None = None,
    rope_base: float = 10.0,
) -> torch.Tensor:
    """Causal self-attention, x (B, T, E) -> (B, T, E)."""
    batch, seq_len, _ = x.shape
    h, g, d, c = shape.n_head, shape.n_kv_head, shape.head_dim, shape.value_dim
    q = x @ p["w_q"].T  # (B, T, H*D)
    k = x @ p["w_k"].T  # (B, T, G*D)
    v = x @ p["w_v"].T  # (B, T, G*C)
    if shape.bias:
        q, k, v = q + p["b_q"], k + p["b_k"], v + p["b_v"]
    q = q.view(batch, seq_len, h, d).transpose(1, 2)  # (B, H, T, D)
    k = k.view(batch, seq_len, g, d).transpose(1, 2)  # (B, G, T, D)
    v = v.view(batch, seq_len, g, c).transpose(1, 2)  # (B, G, T, C)
    if rope is not None:
        q, k = rope_rotate(q, rope, rope_base), rope_rotate(k, rope, rope_base)
    k = k.repeat_interleave(h // g, dim=1)  # (B, H, T, D): head h reads group h // (H/G)
    v = v.repeat_interleave(h // g, dim=1)  # (B, H, T, C)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # (B, H, T, T)
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    weights = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    y = (weights @ v).transpose(1, 2).reshape(batch, seq_len, h * c)  # (B, T, H*C)
    out = y @ p["w_o"].T if "w_o" in p else y  # (B, T, E); the paper's single head has no W_O
    if shape.out_bias:
        out = out + p["b_o"]
    return out


def measure_case(case: NullityCase, seed: int = 0) -> dict:
    """Jacobian nullity of one case at a random point; returns one nullity.csv row."""
    generator = torch.Generator().manual_seed(seed)
    shapes = parameter_shapes(case)
    n_params = sum(math.prod(shape) for shape in shapes.values())
    # Weights ~ N(0, 1/E) keep the scores O(1), so softmax is neither flat nor saturated.
    flat = torch.randn(n_params, generator=generator, dtype=torch.float64) / math.sqrt(case.n_embd)

    if case.kind == "pair":

        def outputs(theta: torch.Tensor) -> torch.Tensor:
            p = unflatten(theta, shapes)
            return (p["A"].T @ p["B"]).reshape(-1)  # every entry of A^T B
    else:
        shape = case.shape()
        # Each position's output lies in the span of W_O (rank <= min(E, H C)): count only those
        # informative rows, or narrow-value layers would look less identified than they are.
        rows_per_sequence = case.seq_len * min(case.n_embd, shape.n_head * shape.value_dim)
        n_sequences = math.ceil(ROW_FACTOR * n_params / rows_per_sequence)
        x = torch.randn(n_sequences, case.seq_len, case.n_embd, generator=generator, dtype=torch.float64)

        def outputs(theta: torch.Tensor) -> torch.Tensor:
            return attention_layer(x, unflatten(theta, shapes), shape, case.rope).reshape(-1)

    jacobian = torch.func.jacfwd(outputs)(flat)  # (n_outputs, n_params)
    singular = torch.linalg.svdvals(jacobian)  # descending
    n_singular = singular.numel()
    rank = int((singular > RANK_RTOL * singular[0]).sum())
    # Directions beyond the number of rows are null too (only possible for tiny pair cases).
    measured = n_params - rank
    kept = singular[rank - 1].item() if rank > 0 else float("nan")
    dropped = singular[rank].item() if rank < n_singular else 0.0
    gap = kept / dropped if dropped > 0 else float("inf")
    theory = theory_nullity(case)
    s = case.shape() if case.kind != "pair" else None
    return {
        "case": case.name,
        "kind": case.kind,
        "n_embd": case.n_embd,
        "n_head": case.n_head if s is None else s.n_head,
        "n_kv_head": (case.n_kv_head or case.n_head) if s is None else s.n_kv_head,
        "head_dim": case.head_dim if s is None else s.head_dim,
        "value_dim": case.head_dim if s is None else s.value_dim,
        "rope": case.rope is not None,
        "rope_pairing": case.rope or "",
        "bias": case.bias,
        "out_bias": False if s is None else s.out_bias,
        "n_params": n_params,
        "n_outputs": jacobian.shape[0],
        "theory": theory,
        "measured": measured,
        "gap": gap,
        "passed": bool(theory == measured and gap >= GAP_REQUIRED),
    }


def verify(
    cases: list[NullityCase] | None = None, progress: Callable[[str], None] | None = None
) -> pd.DataFrame:
    import pandas as pd

    rows = []
    for case in cases if cases is not None else default_cases():
        start = time.perf_counter()
        row = measure_case(case)
        rows.append(row)
        if progress is not None:
            status = "ok" if row["passed"] else "FAIL"
            progress(
                f"{status:4s} {case.name}: theory {row['theory']}, measured {row['measured']} of "
                f"{row['n_params']}, gap {row['gap']:.2e} ({time.perf_counter() - start:.1f} s)"
            )
    return pd.DataFrame(rows)
