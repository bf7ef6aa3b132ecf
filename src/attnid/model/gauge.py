"""The identified parametrisation: the ``adamw_gauge_fixed`` intervention (docs/design.md §14).

Every query-key pair ``(A, B) = (W_Q^{group}, W_K^g)`` and every output-value pair
``(A, B) = (W_V^g, W_O^{group T})`` is determined by its product only up to
``A -> S A``, ``B -> S^{-T} B`` (docs/design.md §2.1; one pair per key/value group
under GQA, §8). Fixing one ``D x D`` block of one factor to a constant invertible
matrix picks one point of every generic orbit, because it determines ``S``. Here,
per group ``g``, a window of ``D`` consecutive weight columns starting at ``s_g``:

- query-key: ``W_K^g[:, s_g : s_g + D] = c_g I``;
- output-value: ``W_V^g[:, s'_g : s'_g + D] = c'_g I``.

Everything else in attention is trained. The windows and scales are chosen once, at
the standard initialisation, so that the move into the gauge is well conditioned and
the gauge point is not lopsided (docs/design.md §14 says why both matter for AdamW):
``s_g`` is the window whose block has the smallest condition number, and ``c_g`` makes
the two factors equally large (``||A'||_F = ||B'||_F``).

The fixed blocks are not parameters at all: per layer :class:`GaugeFixedQKV` holds the
whole ``c_attn.weight`` ``(H*D + 2*G*D, E)`` as one tensor (a buffer, so the metrics, the
τ probe's move and checkpoints see the full matrix under nanoGPT's name) and registers
as parameters only views of its free entries: the query rows, and each key and value
group's columns left and right of its window. An optimizer step writes through those
views; nothing writes the fixed blocks, so they stay bit-exactly ``c_g I`` (no weight
decay, no update). This takes ``2 G D^2`` parameters per layer out of training: the
closed form ``unidentified_qk_params + unidentified_ov_params`` of
:mod:`attnid.theory.counts` for a layer without RoPE.

:func:`fix_gauge` moves a freshly initialised GPT into the gauge along its orbit (same
function, so the same initial function as ``adamw`` for the same seed) and swaps each
layer's ``c_attn`` for a :class:`GaugeFixedQKV`. ``GPT`` itself is unchanged, and so is
the state dict: full matrices under nanoGPT's names, so a checkpoint of this arm loads
in :class:`attnid.model.gpt.GPT` (and in nanoGPT).

Under RoPE the query-key orbit is the rotations' commutant (docs/design.md §8), which
cannot move a block of ``W_K`` to ``c I``; this parametrisation is refused there.

The controls of this arm (docs/design.md §14) come from the same pieces:

- ``fix_gauge(model, at="init")``: the same windows fixed at their *initial* values, no move:
  ``adamw``'s initialisation with ``2 G D^2`` entries per layer frozen. A block fixed to a constant
  invertible matrix ``M`` is a gauge as much as ``c I`` is (the block determines ``S``: ``S F_c = M``),
  so this arm differs from the gauge-fixed one only in where it starts on the orbit;
- :func:`move_to_gauge_point`: the gauge arm's initial point with nothing fixed;
- :class:`FrozenEntries` / :func:`freeze_random_mlp_entries`: as many entries frozen at random in the
  MLP weights, outside attention, where freezing an entry is no gauge.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
from torch.nn import functional as F

from attnid.common.errors import UserError
from attnid.model.gauge_fit import check_gauge_layout
from attnid.model.layout import (
    attention_blocks,
    attention_tensors,
    layout_of,
    pairs_from_tensors,
    row_blocks,
    write_layer_pairs,
)
from attnid.model.options import GAUGE_POINT, INITIAL_POINTS
from attnid.theory.shape import LayerShape

# Which factor of each circuit's pair carries the fixed block: the key B of a query-key pair, the value A of
# an output-value pair (the factors with one D x E matrix per group)
GAUGED_FACTOR = {"qk": "b", "ov": "a"}
# Offset that gives the draw of the frozen MLP entries its own seed, apart from the init's and the batches'
FROZEN_SEED_OFFSET = 15_485_863


def fixed_entries_per_layer(layout: LayerShape) -> int:
    """Entries taken out of training per layer: a ``D x D`` block of each group's key and value
    (``2 G D^2``)."""
    return 2 * layout.n_kv_head * layout.head_dim**2


# --------------------------------------------------------------------------------------
# Pure functions on stacked pairs (G, D, n), float64
# --------------------------------------------------------------------------------------


def best_windows(factor: torch.Tensor, n_embd: int) -> torch.Tensor:
    """Per pair ``(G, D, n)``, the start ``s`` of the ``D`` consecutive weight columns (among the first
    ``n_embd``) whose ``D x D`` block has the smallest condition number: ``(G,)`` long."""
    head_dim = factor.shape[-2]
    windows = factor[..., :n_embd].unfold(-1, head_dim, 1)  # (G, D, E - D + 1, D): windows[g, :, s] = block s
    singular = torch.linalg.svdvals(windows.transpose(-3, -2))  # (G, E - D + 1, D) descending
    condition = singular[..., 0] / singular[..., -1].clamp_min(torch.finfo(singular.dtype).tiny)
    return condition.argmin(-1)


def window_columns(starts: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Each pair's window as weight columns, ``(G, D)``: row ``g`` is ``starts[g] .. starts[g] + D - 1``."""
    return starts[:, None] + torch.arange(head_dim, device=starts.device)


def window_blocks(factor: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """The ``D x D`` block of each pair's factor ``(G, D, n)`` at its window: ``(G, D, D)``."""
    head_dim = factor.shape[-2]
    columns = window_columns(starts, head_dim)[:, None, :].expand(-1, head_dim, -1)
    return torch.take_along_dim(factor, columns, dim=-1)


def gauge_move(
    pair_a: torch.Tensor, pair_b: torch.Tensor, circuit: str, starts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The orbit move of one layer's pairs into the gauge: ``(A', B', condition)`` with ``(G,)`` the
    condition numbers of the blocks inverted (docs/design.md §14).

    With ``F`` the gauged factor (:data:`GAUGED_FACTOR`), ``F_c`` its block at ``starts`` and ``O`` the other
    factor, the move is ``F -> N F``, ``O -> N^{-T} O`` with ``N = c F_c^{-1}``, so that ``F'_c = c I``, and
    ``c^2 = ||F_cᵀ O||_F / ||F_c^{-1} F||_F`` makes ``||F'||_F = ||O'||_F``. The block is then set to exactly
    ``c I`` (the solve leaves it there to round-off).
    """
    gauged, other = (pair_b, pair_a) if GAUGED_FACTOR[circuit] == "b" else (pair_a, pair_b)
    head_dim = gauged.shape[-2]
    columns = window_columns(starts, head_dim)  # (G, D)
    block = window_blocks(gauged, starts)  # (G, D, D)
    unit_gauged = torch.linalg.solve(block, gauged)  # F_c^{-1} F
    unit_other = block.transpose(-1, -2) @ other  # F_cᵀ O
    scale = (unit_other.square().sum((-1, -2)) / unit_gauged.square().sum((-1, -2))).pow(0.25)  # (G,) = c
    new_gauged = scale[:, None, None] * unit_gauged
    new_other = unit_other / scale[:, None, None]
    eye = torch.eye(head_dim, dtype=gauged.dtype, device=gauged.device)
    new_gauged.scatter_(-1, columns[:, None, :].expand(-1, head_dim, -1), scale[:, None, None] * eye)
    condition = torch.linalg.cond(block)
    if GAUGED_FACTOR[circuit] == "b":
        return new_other, new_gauged, condition
    return new_gauged, new_other, condition


# --------------------------------------------------------------------------------------
# The module that replaces c_attn
# --------------------------------------------------------------------------------------


class GaugeFixedQKV(nn.Module):
    """``c_attn`` of a gauge-fixed layer: ``x -> x Wᵀ + b`` with ``W = [W_Q; W_K; W_V]``, where each group's
    key and value window (``key_starts[g]``, ``value_starts[g]``) is fixed at the value it has when the
    module is made: ``c I`` at the gauge point, or the initial block (module docstring).

    ``weight`` ``(H*D + 2*G*D, E)`` is a buffer holding the whole matrix; the parameters are views of its
    free entries (``query_weight`` ``(H*D, E)``, ``key{g}_left`` ``(D, s_g)``, ``key{g}_right``,
    ``value{g}_left``, ...), so the optimizer updates ``weight`` in place, and an in-place write to
    ``weight`` (an orbit move and its restore) is what the next forward uses. ``bias`` (when the model has
    one) is trained as in ``GPT``. The state dict holds ``weight`` and ``bias`` only: nanoGPT's keys.
    """

    weight: torch.Tensor  # a buffer (register_buffer), which Module's attribute lookup cannot type
    bias: torch.Tensor | None
    query_weight: torch.Tensor  # a parameter (register_parameter), as are the free key/value pieces

    def __init__(self, linear: nn.Linear, layout: LayerShape, key_starts: list[int], value_starts: list[int]):
        super().__init__()
        check_gauge_layout(layout)
        self.head_dim, self.n_embd = layout.head_dim, layout.n_embd
        self.query_rows, key_rows, value_rows = row_blocks(layout)
        # kind -> (first row of its block in c_attn, per group the first column of the fixed window)
        self.windows = {
            "key": (key_rows.start, list(key_starts)),
            "value": (value_rows.start, list(value_starts)),
        }
        self.register_buffer("weight", linear.weight.detach().clone())
        self.bias = linear.bias  # the same Parameter (or None)
        for name, view in self._free_views().items():
            self.register_parameter(name, nn.Parameter(view))

    def _group_rows(self, first_row: int, group: int) -> slice:
        return slice(first_row + group * self.head_dim, first_row + (group + 1) * self.head_dim)

    def _group_pieces(
        self, weight: torch.Tensor | None = None
    ) -> list[list[tuple[str | None, torch.Tensor]]]:
        """Per key and value group (in row order), its ``(D, E)`` rows as ``(name, piece)`` left to right:
        the free columns left of the window, the fixed block (name None), the free columns right of it; views
        of ``weight`` (by default the module's own)."""
        weight = self.weight if weight is None else weight
        pieces = []
        for kind, (first_row, starts) in self.windows.items():
            for group, start in enumerate(starts):
                rows = weight[self._group_rows(first_row, group)]
                end = start + self.head_dim
                pieces.append(
                    [
                        (f"{kind}{group}_left", rows[:, :start]),
                        (None, rows[:, start:end]),
                        (f"{kind}{group}_right", rows[:, end:]),
                    ]
                )
        return pieces

    def _free_views(self, weight: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        weight = self.weight if weight is None else weight
        views = {"query_weight": weight[self.query_rows]}
        for row in self._group_pieces(weight):
            views.update({name: piece for name, piece in row if name is not None and piece.shape[1] > 0})
        return views

    def free_views_of(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each parameter's entries in another ``weight``-shaped tensor (its gradient, AdamW's moments of the
        whole matrix: attnid.training.lockstep), as views, by parameter name."""
        return self._free_views(weight)

    def fixed_mask(self) -> torch.Tensor:
        """``weight``'s shape, True at the entries of the fixed blocks."""
        mask = torch.ones_like(self.weight, dtype=torch.bool)
        for view in self._free_views(mask).values():
            view.fill_(False)
        return mask

    def fixed_blocks(self) -> list[torch.Tensor]:
        """The ``(D, D)`` fixed blocks, key groups then value groups (views of ``weight``)."""
        return [piece for row in self._group_pieces() for name, piece in row if name is None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = [self.query_weight]
        for row in self._group_pieces():
            # the fixed block is read from the buffer (no gradient), the rest are the parameters themselves
            rows.append(
                torch.cat(
                    [
                        piece if name is None else self.get_parameter(name)
                        for name, piece in row
                        if piece.shape[1] > 0
                    ],
                    dim=1,
                )
            )  # (D, E)
        return F.linear(x, torch.cat(rows, dim=0), self.bias)  # the weight equals self.weight

    def _point_parameters_at_weight(self) -> None:
        """Make each parameter (the same object, so an optimizer keeps it) a view of ``weight`` again."""
        for name, view in self._free_views().items():
            getattr(self, name).data = view

    def _apply(self, fn, recurse=True):
        # Module.to / .double() give `weight` a new tensor and each parameter a copy of its view
        super()._apply(fn, recurse)
        self._point_parameters_at_weight()
        return self

    def __deepcopy__(self, memo):
        # copy.deepcopy clones each parameter on its own, so a copy's parameters would no longer be its
        # weight's entries and a move of the copy's weight (the tau probe's) would not reach its forward
        clone = self.__class__.__new__(self.__class__)
        memo[id(self)] = clone
        for key, value in self.__dict__.items():
            clone.__dict__[key] = copy.deepcopy(value, memo)
        clone._point_parameters_at_weight()
        return clone

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        # the views are entries of `weight`: nanoGPT's two keys hold everything
        destination[prefix + "weight"] = self.weight if keep_vars else self.weight.detach()
        if self.bias is not None:
            destination[prefix + "bias"] = self.bias if keep_vars else self.bias.detach()

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        # nothing writes a fixed block, so the blocks this module was made with are the ones it must load
        fixed = [block.clone() for block in self.fixed_blocks()]
        for name, target in (("weight", self.weight), ("bias", self.bias)):
            if target is None:
                continue
            key = prefix + name
            if key not in state_dict:
                missing_keys.append(key)
                continue
            value = state_dict[key]
            if tuple(value.shape) != tuple(target.shape):
                error_msgs.append(
                    f"size mismatch for {key}: {tuple(value.shape)} in the checkpoint, "
                    f"{tuple(target.shape)} in the model"
                )
                continue
            with torch.no_grad():
                target.copy_(value)  # in place: the parameter views follow
        if not all(torch.equal(a, b) for a, b in zip(fixed, self.fixed_blocks(), strict=True)):
            error_msgs.append(
                f"{prefix}weight: a fixed block differs from this model's (c I at the gauge point, or "
                f"the initial block): not a checkpoint of this gauge-fixed parametrisation, or of "
                f"another seed's"
            )
        own = {prefix + "weight", prefix + "bias"}
        unexpected_keys.extend(
            k for k in state_dict if k.startswith(prefix) and k not in own and "." not in k[len(prefix) :]
        )


def gauge_holds(qkv: GaugeFixedQKV) -> bool:
    """Whether every fixed block is bit-exactly ``c I`` with ``c > 0`` (the gauge point's blocks)."""
    eye = torch.eye(qkv.head_dim, dtype=qkv.weight.dtype, device=qkv.weight.device)
    return all(
        bool(block[0, 0] > 0) and torch.equal(block, block[0, 0] * eye) for block in qkv.fixed_blocks()
    )


# --------------------------------------------------------------------------------------
# A whole model
# --------------------------------------------------------------------------------------


@torch.no_grad()
def _gauge_windows(model: torch.nn.Module, move: bool) -> tuple[list[dict[str, list[int]]], float]:
    """Per layer, ``{circuit: window starts}`` of the gauged factors' best-conditioned blocks at the current
    weights (:func:`best_windows`), and with ``move`` every pair moved along its orbit to its gauge point
    (:func:`gauge_move`, float64, cast back to the model's dtype). Also returns the largest condition number
    of the blocks: inverted for the move, or (without it) the blocks as they are, which are a gauge only
    where invertible (docs/design.md §14)."""
    layout = layout_of(model)
    check_gauge_layout(layout)
    worst, windows = 1.0, []
    for tensors in attention_tensors(model):
        starts = {}
        for circuit in ("qk", "ov"):
            pair_a, pair_b = pairs_from_tensors(*tensors, layout, circuit)  # (G, D, n) float64
            gauged = pair_b if GAUGED_FACTOR[circuit] == "b" else pair_a
            best = best_windows(gauged, layout.n_embd)  # (G,)
            if move:
                new_a, new_b, condition = gauge_move(pair_a, pair_b, circuit, best)
                write_layer_pairs(tensors, layout, circuit, new_a, new_b)
            else:
                condition = torch.linalg.cond(window_blocks(gauged, best))
            worst = max(worst, float(condition.max()))
            starts[circuit] = best.tolist()
        windows.append(starts)
    return windows, worst


def move_to_gauge_point(model: torch.nn.Module) -> float:
    """Move a stock GPT along its ``GL_D`` orbits to the gauge point of :func:`fix_gauge`, in place, and fix
    nothing: the initial point of ``adamw_gauge_fixed`` for plain training (``attnid train --initial-point
    gauge``; docs/design.md §14). The same function up to the float32 rounding of the moved weights.
    Returns the largest condition number of the blocks inverted."""
    return _gauge_windows(model, move=True)[1]


@torch.no_grad()
def fix_gauge(model: torch.nn.Module, at: str = GAUGE_POINT) -> float:
    """Fix one ``D x D`` block per key and value group and swap every layer's ``c_attn`` for a
    :class:`GaugeFixedQKV`, in place, before an optimizer is made (docs/design.md §14).

    ``at="gauge"`` (``adamw_gauge_fixed``): the model is first moved along its orbits into the gauge
    (:func:`move_to_gauge_point`), so each block is ``c I``. ``at="init"``: nothing moves, and the same
    windows (the best-conditioned blocks) are fixed at their initial values, ``2 G D^2`` entries per layer
    as at the gauge point. Returns the largest condition number of the blocks (inverted, or fixed).
    """
    if at not in INITIAL_POINTS:
        raise ValueError(f"fix_gauge at {at!r}: choose one of {INITIAL_POINTS}")
    layout = layout_of(model)
    windows, worst = _gauge_windows(model, move=at == GAUGE_POINT)
    for block, starts in zip(attention_blocks(model), windows, strict=True):
        block.attn.c_attn = GaugeFixedQKV(block.attn.c_attn, layout, starts["qk"], starts["ov"])
    return worst


@torch.no_grad()
def start_at_gauge(model: torch.nn.Module, probe_tokens: torch.Tensor, point: str, fixed: bool) -> dict:
    """Where a run starts on its orbits (``--initial-point``, docs/design.md §14), in place: with ``fixed``
    (``adamw_gauge_fixed``) :func:`fix_gauge` at ``point``, else :func:`move_to_gauge_point` alone. Before
    the optimizer, a tracker's ``I_0`` and ``torch.compile`` see the model.

    Returns what run.json records of it: the initial point, whether blocks are fixed, the largest condition
    number of the blocks (inverted, or fixed where they are: a gauge only if invertible), and the change of
    the logits of ``probe_tokens`` ``(B, T)`` (eval mode), max-abs over max-abs."""
    model.eval()
    before = model(probe_tokens, full_logits=True)[0]
    condition = fix_gauge(model, at=point) if fixed else move_to_gauge_point(model)
    after = model(probe_tokens, full_logits=True)[0]
    model.train()
    change = float((after - before).abs().max() / before.abs().max())
    return {"initial_point": point, "fixed": fixed, "condition": condition, "logit_change": change}


def gauge_fixed_layers(model: torch.nn.Module) -> list[GaugeFixedQKV]:
    """The model's :class:`GaugeFixedQKV` modules (empty for a stock GPT)."""
    return [
        block.attn.c_attn for block in attention_blocks(model) if isinstance(block.attn.c_attn, GaugeFixedQKV)
    ]


def trainable_attention_params(model: torch.nn.Module) -> int:
    """Entries of the attention layers the optimizer trains (``c_attn``, ``c_proj``, biases included)."""
    return sum(
        param.numel()
        for block in attention_blocks(model)
        for param in block.attn.parameters()
        if param.requires_grad
    )


# --------------------------------------------------------------------------------------
# The control outside attention: as many entries frozen at random in the MLP weights
# --------------------------------------------------------------------------------------


class FrozenEntries:
    """Entries of some parameters held at their current values through training (docs/design.md §14).

    A hook on each parameter zeroes the gradient at its frozen entries, so they enter neither the clipped
    gradient norm nor AdamW's moments (as a fixed block, which is no parameter, does not); :meth:`restore`,
    run after every optimizer step, writes their values back, which undoes AdamW's decoupled weight decay,
    the only thing that still moves them. ``masks`` maps each parameter to its ``bool`` mask (its shape)."""

    def __init__(self, masks: list[tuple[nn.Parameter, torch.Tensor]]):
        self.frozen = [
            (param, mask.to(param.device), param.detach()[mask.to(param.device)].clone())
            for param, mask in masks
        ]
        for param, mask, _ in self.frozen:
            keep = (~mask).to(param.dtype)
            param.register_hook(lambda grad, keep=keep: grad * keep)

    @property
    def count(self) -> int:
        return sum(int(mask.sum()) for _, mask, _ in self.frozen)

    @torch.no_grad()
    def restore(self) -> None:
        for param, mask, values in self.frozen:
            param[mask] = values


def freeze_random_mlp_entries(
    model: torch.nn.Module, seed: int, per_layer: int | None = None
) -> FrozenEntries:
    """Freeze ``per_layer`` entries of every layer's MLP weights (``c_fc`` and ``c_proj`` together, biases
    not), drawn uniformly without replacement from a generator seeded with ``seed +``
    :data:`FROZEN_SEED_OFFSET`, at their current values: the control of ``adamw_gauge_fixed`` outside
    attention. By default as many as the gauge fixes, ``2 G D^2`` (:func:`fixed_entries_per_layer`;
    docs/design.md §14)."""
    if per_layer is None:
        per_layer = fixed_entries_per_layer(layout_of(model))
    generator = torch.Generator().manual_seed(seed + FROZEN_SEED_OFFSET)
    masks = []
    for block in attention_blocks(model):
        weights = [block.mlp.c_fc.weight, block.mlp.c_proj.weight]
        sizes = [w.numel() for w in weights]
        if per_layer > sum(sizes):
            raise UserError(f"cannot freeze {per_layer} of a layer's {sum(sizes)} MLP weight entries")
        chosen = torch.zeros(sum(sizes), dtype=torch.bool)
        chosen[torch.randperm(sum(sizes), generator=generator)[:per_layer]] = True
        for weight, mask in zip(weights, chosen.split(sizes), strict=True):
            masks.append((weight, mask.view(weight.shape)))
    return FrozenEntries(masks)
