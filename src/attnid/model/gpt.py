"""The GPT language model: nanoGPT's architecture, parameter names and checkpoint format.

The paper's experiments train stock nanoGPT, so this file keeps nanoGPT's layout
exactly: pre-LayerNorm blocks, GELU MLP, weight tying between ``wte`` and
``lm_head``, optional biases, dropout, the GPT-2 init with the scaled residual
``c_proj`` init, and fused scaled-dot-product attention. Parameter names are
nanoGPT's (``transformer.h.{i}.attn.c_attn.weight`` ...), so a nanoGPT ``ckpt.pt``
loads unchanged (:func:`load_nanogpt_checkpoint`) and our own checkpoints load in
nanoGPT. The same seed gives the same initial weights as nanoGPT, because the
modules are created and initialised in the same order.

Layout that the symmetry code relies on (docs/design.md §2): ``c_attn.weight`` is
``(3E, E)`` with rows ``[W_Q; W_K; W_V]``, head ``h`` owning rows ``h*D:(h+1)*D``
of each block; ``c_proj.weight`` is ``(E, E)``, head ``h`` owning its columns
``h*D:(h+1)*D``.

Variants (docs/design.md §8), all off by default; off, the model is nanoGPT's
bit for bit (same modules, init order, state-dict keys and ``model_args``):

- ``n_kv_head = G`` (grouped-query attention; ``G = 1`` is multi-query): ``G``
  key/value heads, query head ``h`` reads group ``h // (H/G)``.
- ``head_dim = D`` when it is not ``E/H`` (e.g. one head wider than ``E/H``).
  Values have the same width ``C = D``.
- ``rope``: rotary position embedding on queries and keys (Su et al. 2021), base
  10000, half-split pairing (GPT-NeoX/Llama ``rotate_half``: coordinate ``m`` is
  paired with ``m + D/2``), and no learned position embedding ``wpe``.
- ``tied = False``: ``lm_head`` is its own matrix, not ``wte`` (what ``attnid rotate``
  writes when a residual-stream rotation unties them, docs/design.md §16).

Checkpoint layout of a variant: the same two tensors per layer, resized.
``c_attn.weight`` is ``(H*D + 2*G*D, E)`` with rows ``[W_Q (H*D); W_K (G*D);
W_V (G*D)]`` (``c_attn.bias`` likewise), query head ``h`` owning rows
``h*D:(h+1)*D`` of the first block and group ``g`` rows ``g*D:(g+1)*D`` of the
other two; ``c_proj.weight`` is ``(E, H*D)``, head ``h`` owning columns
``h*D:(h+1)*D``. With ``G = H`` and ``D = E/H`` this is nanoGPT's layout.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch
import torch.nn as nn
from torch.nn import functional as F

from attnid.common.errors import UserError
from attnid.common.files import load_weights_only
from attnid.common.shapes import check_tensor_shapes
from attnid.theory.rope import rope_rotate
from attnid.theory.shape import LayerShape

# torch.compile wraps the model and prefixes every state-dict key with this.
COMPILED_PREFIX = "_orig_mod."


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded to a multiple of 64
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in Linears and LayerNorms, like GPT-2
    # variants (docs/design.md §8); the defaults are nanoGPT's model
    n_kv_head: int | None = None  # G key/value heads (grouped-query attention); None means n_head
    rope: bool = False  # rotary embeddings on queries and keys instead of the learned wpe
    head_dim: int | None = None  # D per head; None means n_embd // n_head
    tied: bool = True  # lm_head is wte (nanoGPT's weight tying)

    @property
    def kv_heads(self) -> int:
        """``G``: the number of key/value heads."""
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def per_head_dim(self) -> int:
        """``D``: the query/key/value width of one head."""
        return self.n_embd // self.n_head if self.head_dim is None else self.head_dim

    @property
    def attention(self) -> LayerShape:
        """The shape of each attention layer (values as wide as keys, ``C = D``; nanoGPT's ``bias`` on the
        query, key, value and output projections alike). Built, not stored: the fields stay nanoGPT's, so
        a nanoGPT checkpoint's ``model_args`` load unchanged."""
        return LayerShape(
            self.n_embd,
            self.n_head,
            self.kv_heads,
            self.per_head_dim,
            self.per_head_dim,
            bool(self.rope),
            bool(self.bias),
            bool(self.bias),
        )

    def model_args(self) -> dict:
        """The ``model_args`` dict of a nanoGPT checkpoint.

        The variant fields are written only when set, so a stock model's
        ``model_args`` has exactly nanoGPT's keys (nanoGPT's ``GPTConfig(**model_args)``
        rejects unknown ones) and old checkpoints, which lack them, mean the defaults.
        """
        args = asdict(self)
        for name, default in VARIANT_DEFAULTS.items():
            if args[name] == default:
                del args[name]
        return args


VARIANT_DEFAULTS = {"n_kv_head": None, "rope": False, "head_dim": None, "tied": True}


def check_config(config: GPTConfig) -> None:
    """Raise ValueError for an attention shape the model cannot build."""
    if config.head_dim is None and config.n_embd % config.n_head != 0:
        raise ValueError(
            f"n_embd={config.n_embd} must be a multiple of n_head={config.n_head} (or set head_dim)"
        )
    if config.per_head_dim < 1:
        raise ValueError(f"head_dim must be positive, got {config.per_head_dim}")
    if config.kv_heads < 1 or config.n_head % config.kv_heads != 0:
        raise ValueError(f"n_kv_head={config.n_kv_head} must divide n_head={config.n_head}")
    if config.rope and config.per_head_dim % 2 != 0:
        raise ValueError(f"rope needs an even head_dim, got {config.per_head_dim}")


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (``nn.LayerNorm`` cannot drop only the bias)."""

    def __init__(self, ndim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    """Causal self-attention; all heads' Q, K, V come from one matmul.

    Multi-head by default; grouped-query with ``n_kv_head``, rotary with ``rope``
    (see the module docstring for the layout).
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        check_config(config)
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.kv_heads, config.per_head_dim
        # widths of the Q, K, V row blocks of c_attn: (E, E, E) for nanoGPT
        self.split_sizes = (
            self.n_head * self.head_dim,
            self.n_kv_head * self.head_dim,
            self.n_kv_head * self.head_dim,
        )
        self.c_attn = nn.Linear(
            config.n_embd, sum(self.split_sizes), bias=config.bias
        )  # rows [W_Q; W_K; W_V]
        # W_O, head h = columns h*D:(h+1)*D
        self.c_proj = nn.Linear(self.n_head * self.head_dim, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.rope = config.rope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, E = x.size()
        H, G, D = self.n_head, self.n_kv_head, self.head_dim
        q, k, v = self.c_attn(x).split(self.split_sizes, dim=2)  # (B, T, H*D), (B, T, G*D), (B, T, G*D)
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, G, D).transpose(1, 2)  # (B, G, T, D)
        v = v.view(B, T, G, D).transpose(1, 2)  # (B, G, T, D)
        if self.rope:
            q, k = rope_rotate(q), rope_rotate(k)
        # softmax(q k^T / sqrt(D)) v with a causal mask; the scale is SDPA's default 1/sqrt(D).
        # With G < H, enable_gqa lets query head h read key/value head h // (H/G).
        extra = {"enable_gqa": True} if G != H else {}
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0.0, is_causal=True, **extra
        )
        y = y.transpose(1, 2).contiguous().view(B, T, H * D)  # heads side by side again: (B, T, H*D)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))  # (B, T, E) -> (B, T, 4E) -> (B, T, E)


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    # an nn.ModuleDict (wte, wpe without RoPE, drop, h, ln_f) read by attribute, as nanoGPT does: its
    # entries are only known at run time, so the type checker takes them as they come
    transformer: Any

    def __init__(self, config: GPTConfig):
        super().__init__()
        assert config.vocab_size is not None and config.block_size is not None
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                # RoPE models carry positions in the attention instead (no wpe, as Llama)
                **({} if config.rope else {"wpe": nn.Embedding(config.block_size, config.n_embd)}),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tied:  # weight tying: one (V, E) matrix embeds tokens and reads out logits
            self.transformer.wte.weight = self.lm_head.weight

        # GPT-2 init, in nanoGPT's module order so the same seed gives the same weights
        self.apply(self._init_weights)
        # residual projections get std 0.02/sqrt(2 n_layer): each block adds two of them to the stream
        for name, param in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; like nanoGPT, position embeddings are left out by default."""
        n_params = sum(p.numel() for p in self.parameters())
        if non_embedding and "wpe" in self.transformer:
            n_params -= self.transformer.wpe.weight.numel()
        return n_params

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, full_logits: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) token ids -> (logits, loss).

        With ``targets`` (B, T): logits (B, T, V) and the mean cross-entropy.
        Without: as nanoGPT, logits of the last position only, (B, 1, V), and
        ``loss=None`` -- unless ``full_logits=True``, which gives all (B, T, V)
        (the tau probe compares every position's logits).
        """
        B, T = idx.size()
        assert T <= self.config.block_size, f"sequence of length {T} > block size {self.config.block_size}"
        x = self.transformer.wte(idx)  # (B, T, E)
        if "wpe" in self.transformer:
            pos = torch.arange(0, T, dtype=torch.long, device=idx.device)  # (T,)
            x = x + self.transformer.wpe(pos)
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)  # (B, T, E)

        if targets is not None:
            logits = self.lm_head(x)  # (B, T, V)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        elif full_logits:
            logits, loss = self.lm_head(x), None  # (B, T, V)
        else:
            logits, loss = self.lm_head(x[:, [-1], :]), None  # (B, 1, V); [-1] keeps the time dim
        return logits, loss

    def optimizer_groups(self, weight_decay: float) -> list[dict]:
        """nanoGPT's two parameter groups: matrices and embeddings (>= 2-D) decay, biases and LayerNorms
        do not."""
        params = [p for p in self.parameters() if p.requires_grad]  # the tied wte/lm_head matrix appears once
        return [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]


def strip_compiled_prefix(state_dict: dict) -> dict:
    """Drop the ``_orig_mod.`` prefix that ``torch.compile`` adds to every key of a saved model."""
    return {
        (k[len(COMPILED_PREFIX) :] if k.startswith(COMPILED_PREFIX) else k): v for k, v in state_dict.items()
    }


# model_args sizes: positive integers up to this (torch indexes tensors with 64-bit sizes; no model comes
# near 2^31 in any one dimension), so a declared size can never make shape arithmetic run away
MODEL_ARGS_SIZE_LIMIT = 2**31 - 1
REQUIRED_MODEL_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")


def config_from_model_args(model_args: dict, where: str = "checkpoint") -> GPTConfig:
    """A GPTConfig from a checkpoint's ``model_args`` (unknown keys are ignored, as newer nanoGPTs add
    some), each known value checked for its type and range first: sizes positive integers up to
    :data:`MODEL_ARGS_SIZE_LIMIT`, ``dropout`` a number in [0, 1), ``bias`` and ``rope`` booleans."""
    known = {f.name for f in fields(GPTConfig)}
    missing = sorted(set(REQUIRED_MODEL_ARGS) - set(model_args))
    if missing:
        raise UserError(f"{where}: 'model_args' lacks {missing}: not a nanoGPT checkpoint")
    for name in (*REQUIRED_MODEL_ARGS, "n_kv_head", "head_dim"):
        value = model_args.get(name)
        if value is None and name not in REQUIRED_MODEL_ARGS:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MODEL_ARGS_SIZE_LIMIT:
            raise UserError(
                f"{where}: 'model_args' has {name}={value!r}; expected an integer from 1 to "
                f"{MODEL_ARGS_SIZE_LIMIT}"
            )
    dropout = model_args.get("dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
        raise UserError(f"{where}: 'model_args' has dropout={dropout!r}; expected a number in [0, 1)")
    for name in ("bias", "rope", "tied"):
        if name in model_args and not isinstance(model_args[name], bool):
            raise UserError(f"{where}: 'model_args' has {name}={model_args[name]!r}; expected true or false")
    return GPTConfig(**{k: v for k, v in model_args.items() if k in known})


def stored_layer_count(state_dict: dict) -> int:
    """Blocks a state dict stores: the distinct ``i`` of ``transformer.h.{i}.`` keys."""
    prefix = "transformer.h."
    return len({k[len(prefix) :].split(".", 1)[0] for k in state_dict if str(k).startswith(prefix)})


def expected_state_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """The state dict's ``{name: shape}`` of a GPT with ``config``, without building it (no memory, no
    time): the layout of the module docstring. ``tests/model/test_model.py`` holds it equal to a built
    model's."""
    try:
        check_config(config)
    except ValueError as err:
        raise UserError(f"no GPT has this shape: {err}") from None
    E, V, H, G, D = config.n_embd, config.vocab_size, config.n_head, config.kv_heads, config.per_head_dim

    def linear(name: str, n_out: int, n_in: int) -> dict:
        return {f"{name}.weight": (n_out, n_in), **({f"{name}.bias": (n_out,)} if config.bias else {})}

    def layer_norm(name: str) -> dict:
        return {f"{name}.weight": (E,), **({f"{name}.bias": (E,)} if config.bias else {})}

    shapes = {"transformer.wte.weight": (V, E)}
    if not config.rope:
        shapes["transformer.wpe.weight"] = (config.block_size, E)
    for layer in range(config.n_layer):
        block = f"transformer.h.{layer}"
        shapes |= layer_norm(f"{block}.ln_1") | linear(f"{block}.attn.c_attn", H * D + 2 * G * D, E)
        shapes |= linear(f"{block}.attn.c_proj", E, H * D) | layer_norm(f"{block}.ln_2")
        shapes |= linear(f"{block}.mlp.c_fc", 4 * E, E) | linear(f"{block}.mlp.c_proj", E, 4 * E)
    return shapes | layer_norm("transformer.ln_f") | {"lm_head.weight": (V, E)}


def parameter_count(config: GPTConfig) -> int:
    """Parameters of a GPT with ``config``, counted from :func:`expected_state_shapes` (a tied ``lm_head``
    is ``wte``: counted once): the shapes of a model with no block and with one, so that the count takes
    the same time for any ``n_layer`` (a memory check of a declared 10^9 layers must not list them)."""

    def count(n_layer: int) -> int:
        shapes = expected_state_shapes(replace(config, n_layer=n_layer))
        return sum(
            math.prod(shape) for name, shape in shapes.items() if name != "lm_head.weight" or not config.tied
        )

    without_blocks = count(0)
    return without_blocks + config.n_layer * (count(1) - without_blocks)


def model_from_checkpoint(checkpoint: dict, where: str = "checkpoint") -> GPT:
    """Build a GPT from a nanoGPT-format checkpoint dict (``model_args`` + ``model``), after checking
    every stored tensor's shape against ``model_args`` (one line naming the first that disagrees)."""
    if not isinstance(checkpoint, dict) or "model_args" not in checkpoint or "model" not in checkpoint:
        raise UserError(f"{where} is not a nanoGPT checkpoint: expected a dict with 'model_args' and 'model'")
    if not isinstance(checkpoint["model_args"], dict) or not isinstance(checkpoint["model"], dict):
        raise UserError(f"{where} is not a nanoGPT checkpoint: 'model_args' and 'model' must be dicts")
    config = config_from_model_args(checkpoint["model_args"], where)
    if not all(isinstance(key, str) for key in checkpoint["model"]):
        raise UserError(f"{where}: 'model' stores a tensor under a key that is not a name")
    state_dict = strip_compiled_prefix(checkpoint["model"])
    # very old nanoGPTs saved the causal-mask buffer as 'attn.bias'; it carries no weights
    state_dict = {
        k: v
        for k, v in state_dict.items()
        if not (k.endswith(".attn.bias") and getattr(v, "dim", lambda: 0)() == 4)
    }
    if not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        raise UserError(f"{where} is not a nanoGPT checkpoint: 'model' holds something other than tensors")
    if stored_layer_count(state_dict) != config.n_layer:  # before shapes are derived from a declared size
        raise UserError(
            f"{where}: model_args says n_layer={config.n_layer} but the weights have "
            f"{stored_layer_count(state_dict)} layers"
        )
    check_tensor_shapes(
        expected_state_shapes(config),
        {k: v.shape for k, v in state_dict.items()},
        where,
        source="its model_args",
    )
    model = GPT(config)
    try:
        model.load_state_dict(state_dict)
    except RuntimeError as err:
        first_line = str(err).strip().splitlines()[-1].strip()
        raise UserError(f"{where}: checkpoint weights do not fit its model_args: {first_line}") from None
    return model


def load_nanogpt_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> GPT:
    """Load a nanoGPT ``ckpt.pt`` (ours or nanoGPT's, compiled or not) as a GPT in eval mode."""
    # weights only: a checkpoint that carries code is refused before the code runs
    checkpoint = load_weights_only(path)
    model = model_from_checkpoint(checkpoint, where=str(path))
    model.to(map_location)
    model.eval()
    return model
