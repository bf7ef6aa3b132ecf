"""The moves of ``attnid rotate`` on a :class:`~attnid.edits.whole_checkpoint.WholeCheckpoint`, each an
element of one of the census's symmetry classes (docs/design.md §16), and the data-driven choices of
their parameters. Float64 functions; each move changes the model in place (a model's float64 copy is the
largest object a command holds: two would not fit a 4 GiB budget for a 135M model), returns it, and
leaves its function unchanged (exactly, up to round-off).

- :func:`fuse_norms` (class ``norm_gain``): each norm's gain into the columns of its readers, gain 1; a
  LayerNorm bias into the readers' biases where every reader has one, else kept as ``beta / gamma``.
- :func:`rotate_stream` (class ``stream_rotation``): ``x -> Q x``; writers ``Q W``, readers ``W Q^T``
  (conjugated by the norm's gain where it is not 1).
- :func:`move_value_output` (``attention_ov``): per key/value group ``W_V -> M W_V``, ``W_O^h -> W_O^h M^-1``.
- :func:`move_query_key` (``attention_qk``): queries ``A W_Q^h``, keys ``A^-T W_K``; under RoPE ``A`` must
  commute with the rotations: a scaled rotation in every plane ``(p, p + D/2)``.
- :func:`scale_junctions` (``norm_gain``'s diagonal) and :func:`scale_gated_hidden` (``gated_mlp_scale``):
  channel scales, the orbit part of SmoothQuant.

Layout: the census's names, every matrix out x in (``h{l}.attn.w_q`` ``(H D, E)``, ``h{l}.attn.w_o``
``(E, H D)``); query head ``h`` reads key/value group ``h // (H/G)``.
"""

from __future__ import annotations

import torch

from attnid.edits.orthogonal import hadamard
from attnid.edits.whole_checkpoint import LM_HEAD, WholeCheckpoint
from attnid.theory import whole_model as theory

RIDGE = 1e-9  # relative ridge on a covariance before it is inverted (a direction no token reached)


def junction_readers(shape: theory.WholeModelShape, layer: int) -> dict[str, list[str]]:
    """Each norm of a layer and the weights that read it (``ln_1``: q/k/v; ``ln_2``: the MLP's inputs)."""
    p = f"h{layer}."
    mlp = ("w_gate", "w_up") if shape.mlp in theory.GATED_MLPS else ("w_fc",)
    return {
        p + "ln_1": [p + "attn.w_q", p + "attn.w_k", p + "attn.w_v"],
        p + "ln_2": [p + f"mlp.{name}" for name in mlp],
    }


def all_junctions(whole: WholeCheckpoint) -> dict[str, list[str]]:
    """Every norm with its readers, ``ln_f`` (read by ``lm_head``, or by ``wte`` when tied) last."""
    found: dict[str, list[str]] = {}
    for layer in range(whole.shape.n_layer):
        found |= junction_readers(whole.shape, layer)
    found["ln_f"] = ["wte" if whole.shape.tied else LM_HEAD]
    return found


def _bias_of(weight: str) -> str:
    """The bias of a reader's weight (``lm_head`` has none: a name no parameter has)."""
    return weight.replace(".w_", ".b_") if ".w_" in weight else weight + ".bias"


def fuse_norms(whole: WholeCheckpoint) -> WholeCheckpoint:
    """Every free norm's gain (and LayerNorm bias) into its readers; gains become 1. A tied model's final
    norm is not free (its reader is the embedding, class ``norm_gain``) and is left as it is."""
    params = whole.params
    for norm, readers in all_junctions(whole).items():
        if readers == ["wte"]:
            continue
        gain, bias = params[norm + ".weight"], params.get(norm + ".bias")
        if bool((gain == 0).any()):
            raise ValueError(f"{norm} has a zero gain: it cannot be fused into its readers")
        absorb = bias is not None and all(_bias_of(r) in params for r in readers)
        for reader in readers:
            weight = params[reader]
            if absorb:
                assert bias is not None
                params[_bias_of(reader)] = params[_bias_of(reader)] + weight @ bias
            params[reader] = weight * gain[None, :]
        if bias is not None:
            params[norm + ".bias"] = torch.zeros_like(bias) if absorb else bias / gain
        params[norm + ".weight"] = torch.ones_like(gain)
    return whole


def writer_names(whole: WholeCheckpoint) -> list[str]:
    """What writes into the residual stream: embeddings (rows), ``W_O``, the MLP's down projection, their
    biases (columns)."""
    names = []
    for layer in range(whole.shape.n_layer):
        p = f"h{layer}."
        names += [p + "attn.w_o", p + "attn.b_o", p + "mlp.w_down", p + "mlp.b_down"]
    return [name for name in names if name in whole.params]


def rotate_stream(whole: WholeCheckpoint, rotation: torch.Tensor) -> WholeCheckpoint:
    """``x -> Q x`` on the residual stream of an untied model (class ``stream_rotation``): ``wte``, ``wpe``
    rows times ``Q^T``; ``W_O``, down projections and their biases ``Q W``; every norm keeps its gain
    ``gamma``, its readers become ``W diag(gamma) Q^T diag(gamma)^-1`` and a LayerNorm bias
    ``diag(gamma) Q diag(gamma)^-1 beta`` (with fused norms, ``gamma = 1``: ``W Q^T`` and ``Q beta``).
    Exact for RMSNorm with any ``Q``, for LayerNorm with ``Q 1_E = 1_E``."""
    if whole.shape.tied:
        raise ValueError("rotate_stream needs an untied model")
    params = whole.params
    for name in ("wte", "wpe"):
        if name in params:
            params[name] = params[name] @ rotation.T
    for name in writer_names(whole):
        params[name] = rotation @ params[name]
    for norm, readers in all_junctions(whole).items():
        gain = params[norm + ".weight"]
        if bool((gain == 0).any()):
            raise ValueError(f"{norm} has a zero gain: the stream cannot be rotated past it")
        inverse = 1 / gain
        for reader in readers:  # W diag(gamma) Q^T diag(gamma)^-1
            params[reader] = params[reader] @ (gain[:, None] * rotation.T * inverse[None, :])
        if norm + ".bias" in params:  # diag(gamma) Q diag(gamma)^-1 beta
            params[norm + ".bias"] = gain * (rotation @ (inverse * params[norm + ".bias"]))
    return whole


def _heads_of_group(shape: theory.WholeModelShape, group: int) -> range:
    per = shape.attention.heads_per_group
    return range(group * per, (group + 1) * per)


def move_value_output(whole: WholeCheckpoint, matrices: list[torch.Tensor]) -> WholeCheckpoint:
    """Per layer ``matrices[l]`` ``(G, D, D)``: ``W_V^g -> M_g W_V^g`` (and ``b_V``),
    ``W_O^h -> W_O^h M_g^-1`` for every query head ``h`` of group ``g`` (class ``attention_ov``)."""
    params, d = whole.params, whole.shape.attention.head_dim
    for layer, moves in enumerate(matrices):
        p = f"h{layer}.attn."
        inverse = torch.linalg.inv(moves)
        w_v, w_o = params[p + "w_v"].clone(), params[p + "w_o"].clone()
        b_v = params[p + "b_v"].clone() if p + "b_v" in params else None
        for group, (move, back) in enumerate(zip(moves, inverse, strict=True)):
            rows = slice(group * d, (group + 1) * d)
            w_v[rows] = move @ params[p + "w_v"][rows]
            if b_v is not None:
                b_v[rows] = move @ params[p + "b_v"][rows]
            for head in _heads_of_group(whole.shape, group):
                cols = slice(head * d, (head + 1) * d)
                w_o[:, cols] = params[p + "w_o"][:, cols] @ back
        params[p + "w_v"], params[p + "w_o"] = w_v, w_o
        if b_v is not None:
            params[p + "b_v"] = b_v
    return whole


def move_query_key(whole: WholeCheckpoint, matrices: list[torch.Tensor]) -> WholeCheckpoint:
    """Per layer ``matrices[l]`` ``(G, D, D)``: every query head of group ``g`` ``A_g W_Q^h`` (and
    ``b_Q``), the group's key ``A_g^-T W_K^g`` (and ``b_K``), so ``q^T k`` is unchanged (class
    ``attention_qk``)."""
    params, d = whole.params, whole.shape.attention.head_dim
    for layer, moves in enumerate(matrices):
        p = f"h{layer}.attn."
        key_moves = torch.linalg.inv(moves).transpose(-1, -2)
        for kind in ("w", "b"):
            if p + f"{kind}_q" not in params:
                continue
            q, k = params[p + f"{kind}_q"].clone(), params[p + f"{kind}_k"].clone()
            for group in range(len(moves)):
                rows = slice(group * d, (group + 1) * d)
                k[rows] = key_moves[group] @ params[p + f"{kind}_k"][rows]
                for head in _heads_of_group(whole.shape, group):
                    head_rows = slice(head * d, (head + 1) * d)
                    q[head_rows] = moves[group] @ params[p + f"{kind}_q"][head_rows]
            params[p + f"{kind}_q"], params[p + f"{kind}_k"] = q, k
    return whole


def scale_junctions(whole: WholeCheckpoint, scales: dict[str, torch.Tensor]) -> WholeCheckpoint:
    """Per norm ``s`` ``(E,)``: the norm's output channels divided by ``s`` (gain and bias), its readers'
    columns times ``s`` (class ``norm_gain``)."""
    params = whole.params
    junctions = all_junctions(whole)
    for norm, scale in scales.items():
        params[norm + ".weight"] = params[norm + ".weight"] / scale
        if norm + ".bias" in params:
            params[norm + ".bias"] = params[norm + ".bias"] / scale
        for reader in junctions[norm]:
            params[reader] = params[reader] * scale[None, :]
    return whole


def scale_gated_hidden(whole: WholeCheckpoint, scales: list[torch.Tensor]) -> WholeCheckpoint:
    """Per layer ``s`` ``(F,)``: hidden unit ``k`` of a gated MLP divided by ``s_k`` (its up row and bias),
    its down column times ``s_k`` (class ``gated_mlp_scale``)."""
    params = whole.params
    for layer, scale in enumerate(scales):
        p = f"h{layer}.mlp."
        params[p + "w_up"] = params[p + "w_up"] / scale[:, None]
        if p + "b_up" in params:
            params[p + "b_up"] = params[p + "b_up"] / scale
        params[p + "w_down"] = params[p + "w_down"] * scale[None, :]
    return whole


# --------------------------------------------------------------------------------------
# the data-driven choices (docs/design.md §16)
# --------------------------------------------------------------------------------------


def _sym_power(matrix: torch.Tensor, power: float) -> torch.Tensor:
    values, vectors = torch.linalg.eigh(matrix)
    return (vectors * values.clamp(min=0) ** power) @ vectors.T


def metric_balance(quantized: torch.Tensor, amplifier: torch.Tensor) -> torch.Tensor:
    """``P``: the geometric mean ``Sigma^-1 # K = Sigma^-1/2 (Sigma^1/2 K Sigma^1/2)^1/2 Sigma^-1/2`` of the
    quantized side's inverse covariance and the amplifier ``K``. ``M`` with ``M^T M = P`` minimises
    ``tr(M Sigma M^T) tr(M^-T K M^-1)``: the rounding noise of ``M x`` (its energy) times how much the other
    factor ``W M^-1`` (``W^T W = K``) amplifies it. It is the balanced point (§4.2) in the data's metric:
    after the move both traces are equal and ``P`` is the identity, so the move is its own fixed point."""
    d = quantized.shape[-1]
    eye = torch.eye(d, dtype=quantized.dtype)
    sigma = quantized + RIDGE * torch.trace(quantized) / d * eye
    root = _sym_power(sigma, 0.5)
    inverse_root = _sym_power(sigma, -0.5)
    return inverse_root @ _sym_power(root @ amplifier @ root, 0.5) @ inverse_root


def spreading_rotation(covariance: torch.Tensor) -> torch.Tensor:
    """``H U^T``: the principal axes of ``covariance`` (descending, each signed to have a positive product
    with ``H 1``), then a Hadamard matrix that spreads each axis over every coordinate, so every
    coordinate carries the same energy. Canonical: applied to the result it gives the identity (the
    identity in place of ``H`` where no Hadamard matrix of that order is built)."""
    d = covariance.shape[-1]
    spread = hadamard(d)
    spread = torch.eye(d, dtype=covariance.dtype) if spread is None else spread.to(covariance.dtype)
    values, vectors = torch.linalg.eigh(covariance)
    vectors = vectors[:, torch.argsort(values, descending=True)]
    reference = spread @ torch.ones(d, dtype=covariance.dtype)
    signs = torch.sign(reference @ vectors)
    vectors = vectors * torch.where(signs == 0, torch.ones_like(signs), signs)[None, :]
    return spread @ vectors.T


def optimized_pair_move(quantized: torch.Tensor, amplifier: torch.Tensor) -> torch.Tensor:
    """``M = H U^T P^1/2``: :func:`metric_balance`'s ``P``, then :func:`spreading_rotation` of the moved
    covariance ``P^1/2 Sigma P^1/2``. ``quantized``: the covariance of what is rounded (values, keys);
    ``amplifier``: what its error is read through (``W_O^T W_O`` summed over the group's heads; the
    queries' covariance)."""
    half = _sym_power(metric_balance(quantized, amplifier), 0.5)
    return spreading_rotation(half @ quantized @ half) @ half


def rope_plane_scales(key_covariance: torch.Tensor, query_covariance: torch.Tensor) -> torch.Tensor:
    """Under RoPE ``A`` is ``c_p`` times a rotation in each plane ``(p, p + D/2)``: the optimum of
    :func:`metric_balance` restricted to it has ``c_p^4 = e_k(p) / e_q(p)`` (plane energies of the keys and
    of the queries), normalised to a geometric mean of 1. Returns ``A`` ``(D, D)`` (no rotation part)."""
    d = key_covariance.shape[-1]
    diagonal_k, diagonal_q = torch.diagonal(key_covariance), torch.diagonal(query_covariance)
    energy_k = diagonal_k[: d // 2] + diagonal_k[d // 2 :]
    energy_q = diagonal_q[: d // 2] + diagonal_q[d // 2 :]
    floor = 1e-30
    c = ((energy_k + floor) / (energy_q + floor)) ** 0.25
    c = c / torch.exp(torch.log(c).mean())
    return torch.diag(torch.cat([c, c]))


def random_rope_commutant(d: int, generator: torch.Generator) -> torch.Tensor:
    """A random element of the RoPE commutant: in each plane ``(p, p + D/2)`` a scale in ``[0.5, 2]`` times a
    rotation by a uniform angle (the scale and phase halves of the RoPE sub-orbit)."""
    half = d // 2
    scale = 2 ** (torch.rand(half, generator=generator, dtype=torch.float64) * 2 - 1)
    angle = torch.rand(half, generator=generator, dtype=torch.float64) * 2 * torch.pi
    move = torch.zeros(d, d, dtype=torch.float64)
    idx = torch.arange(half)
    move[idx, idx] = scale * torch.cos(angle)
    move[idx + half, idx + half] = scale * torch.cos(angle)
    move[idx, idx + half] = -scale * torch.sin(angle)
    move[idx + half, idx] = scale * torch.sin(angle)
    return move


def smoothing_scales(input_max: torch.Tensor, weight_max: torch.Tensor) -> torch.Tensor:
    """SmoothQuant's ``s_j = sqrt(max |x_j| / max |W_:j|)`` (migration strength 1/2): after the move both
    maxima are ``sqrt(max |x_j| max |W_:j|)``, so the move is its own fixed point (scales 1 the second
    time). Channels that never fire keep scale 1."""
    ok = (input_max > 0) & (weight_max > 0)
    ratio = torch.where(ok, input_max / torch.where(ok, weight_max, torch.ones_like(weight_max)), 1.0)
    return ratio.sqrt()
