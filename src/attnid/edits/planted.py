"""A seeded random element of every class of a model's symmetry orbit, to check an alignment against
(``attnid plant``, docs/design.md §17): ``B = g A`` computes A's function, and ``attnid align A B`` must
bring B back to A. The classes are :mod:`attnid.edits.alignment_classes`'s, the moves
:mod:`attnid.edits.orbit_moves`'s; any family the census reads (nanoGPT, GPT-2, Llama, Mistral, Qwen2,
Gemma)."""

from __future__ import annotations

import math

import torch

from attnid.edits.alignment_classes import (
    PLANES,
    complement_of_ones,
    permute_heads,
    permute_mlp,
    permute_stream,
    plane_matrix,
    spec_of,
)
from attnid.edits.orbit_moves import (
    all_junctions,
    move_query_key,
    move_value_output,
    rotate_stream,
    scale_junctions,
)
from attnid.edits.orthogonal import haar_orthogonal
from attnid.edits.whole_checkpoint import WholeCheckpoint

NEGATIVE_GAINS = 0.5  # the chance that a planted gain scale is negative (a sign flip with its readers')


def random_group_element(
    whole: WholeCheckpoint,
    seed: int,
    gl: bool = False,
    stream: bool = False,
    negative: float = NEGATIVE_GAINS,
) -> WholeCheckpoint:
    """``g`` times ``whole``, ``g`` a seeded random element of every class its architecture has (in place):
    key/value groups and query heads within them permuted, MLP hidden units permuted, per group an ``ov``
    and a ``qk`` move (orthogonal; with RoPE a rotation per plane; ``gl``: well-conditioned GL(D) and,
    with RoPE, a rotation-scaling per plane); ``stream``: also the residual stream's coordinates permuted,
    rotated (untied models; fixing ``1`` under LayerNorm) and every free norm's gains scaled (magnitudes
    in ``[2^-1/2, 2^1/2]``, each sign negative with probability ``negative``: a flip is as exact a
    symmetry as a positive scale, docs/design.md §17)."""
    generator = torch.Generator().manual_seed(seed)
    spec = spec_of(whole)
    g, per, d = spec.n_kv_head, spec.per_group, spec.head_dim
    for layer in range(spec.n_layer):
        groups = torch.randperm(g, generator=generator).tolist()
        inner = [torch.randperm(per, generator=generator).tolist() for _ in range(g)]
        order = [groups[i] * per + k for i in range(g) for k in inner[i]]
        permute_heads(whole, layer, order)
        hidden = whole.params[f"h{layer}.mlp.w_down"].shape[1]
        permute_mlp(whole, layer, torch.randperm(hidden, generator=generator).tolist())

    def scale(n: int) -> torch.Tensor:  # in [2^-1/2, 2^1/2] for GL, else 1
        spread = torch.rand(n, generator=generator, dtype=torch.float64) - 0.5
        return 2 ** (spread if gl else 0 * spread)

    def element(circuit: str) -> torch.Tensor:
        if spec.form(circuit) == PLANES:
            angle = torch.rand(d // 2, generator=generator, dtype=torch.float64) * 2 * math.pi
            size = scale(d // 2)
            return plane_matrix(size * torch.cos(angle), size * torch.sin(angle))
        return haar_orthogonal(d, generator) * scale(d)[None, :]

    for move, circuit in ((move_value_output, "ov"), (move_query_key, "qk")):
        whole = move(whole, [torch.stack([element(circuit) for _ in range(g)]) for _ in range(spec.n_layer)])
    if stream:
        plant_stream(whole, generator, negative)
    return whole


def plant_stream(
    whole: WholeCheckpoint, generator: torch.Generator, negative: float = NEGATIVE_GAINS
) -> None:
    """The residual stream's classes, seeded: a permutation, a rotation (untied), gain scales, each negative
    with probability ``negative`` (in place)."""
    e = whole.params["wte"].shape[1]
    permute_stream(whole, torch.randperm(e, generator=generator).tolist())
    if not whole.shape.tied:
        rotation = haar_orthogonal(e, generator)
        if whole.shape.norm == "layernorm":  # fix 1_E: a rotation of its complement
            ones = torch.full((e, 1), e**-0.5, dtype=torch.float64)
            basis = complement_of_ones(e)
            rotation = basis @ haar_orthogonal(e - 1, generator) @ basis.T + ones @ ones.T
        rotate_stream(whole, rotation)
    scales = {}
    for norm, readers in all_junctions(whole).items():
        if readers != ["wte"]:
            size = 2 ** (torch.rand(e, generator=generator, dtype=torch.float64) - 0.5)
            sign = torch.where(torch.rand(e, generator=generator, dtype=torch.float64) < negative, -1.0, 1.0)
            scales[norm] = sign.to(torch.float64) * size
    scale_junctions(whole, scales)
