"""``S`` models of one :class:`attnid.model.gpt.GPT` configuration in one forward pass: runs in lockstep.

The interventions' runs are tiny (one layer, ``E = 24``): one run's step is a few hundred small kernels,
and a batch of runs pays for them once. Here each parameter carries a leading run dimension (``params``
maps nanoGPT's names, as :meth:`GPT.named_parameters` gives them, to ``(S, *shape)`` tensors), every
linear layer is a batched matmul and attention folds the runs into its batch dimension. The arithmetic
is :meth:`GPT.forward`'s, op for op (docs/design.md §11.6): the same layers, in the same order, with the
same variants (biases, grouped-query heads, RoPE, untied ``lm_head``), so a slice equals its own model to
float rounding (tests/model/test_stacked.py), and no slice reads another's numbers.

    idx (S, B, T) -> x (S, B*T, E) -> blocks -> ln_f -> logits (S, B*T, V) -> loss (S,)
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from attnid.model.gpt import GPT, GPTConfig
from attnid.theory.rope import rope_rotate

LAYER_NORM_EPS = 1e-5  # attnid.model.gpt.LayerNorm's


def stack_parameters(models: list[GPT]) -> dict[str, torch.Tensor]:
    """``{name: (S, *shape)}``: each model's parameters under nanoGPT's names (its ``state_dict``: a
    gauge-fixed model's ``c_attn.weight`` is the whole matrix), one per :meth:`GPT.named_parameters` name of
    a plain model of the same configuration, stacked in the order of ``models``."""
    names = parameter_names(models[0].config)
    states = [model.state_dict() for model in models]
    return {name: torch.stack([state[name].detach() for state in states]).clone() for name in names}


def parameter_names(config: GPTConfig) -> list[str]:
    """The trainable tensors' names of a plain :class:`GPT` (the tied ``lm_head.weight`` is ``wte``'s)."""
    with torch.device("meta"):
        return [name for name, _ in GPT(config).named_parameters()]


def _run_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (S, N, in), weight (S, out, in), bias (S, out) -> (S, N, out)."""
    y = torch.bmm(x, weight.transpose(1, 2))
    return y if bias is None else y + bias[:, None, :]


def _layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Per run its own gain and bias: the normalisation, then ``* weight + bias`` as F.layer_norm does."""
    y = F.layer_norm(x, x.shape[-1:], None, None, LAYER_NORM_EPS) * weight[:, None, :]
    return y if bias is None else y + bias[:, None, :]


def _run_attention(config: GPTConfig, x: torch.Tensor, params: dict, prefix: str, batch: int) -> torch.Tensor:
    """CausalSelfAttention.forward for S runs: x (S, B*T, E) -> (S, B*T, E)."""
    S, N, _ = x.shape
    B, T = batch, N // batch
    H, G, D = config.n_head, config.kv_heads, config.per_head_dim
    qkv = _run_linear(x, params[prefix + "c_attn.weight"], params.get(prefix + "c_attn.bias"))
    q, k, v = qkv.split((H * D, G * D, G * D), dim=2)  # (S, B*T, H*D), (S, B*T, G*D), (S, B*T, G*D)
    q = q.reshape(S * B, T, H, D).transpose(1, 2)  # (S*B, H, T, D): the runs are more sequences
    k = k.reshape(S * B, T, G, D).transpose(1, 2)  # (S*B, G, T, D)
    v = v.reshape(S * B, T, G, D).transpose(1, 2)
    if config.rope:
        q, k = rope_rotate(q), rope_rotate(k)
    extra = {"enable_gqa": True} if G != H else {}
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True, **extra)
    y = y.transpose(1, 2).reshape(S, N, H * D)
    return _run_linear(y, params[prefix + "c_proj.weight"], params.get(prefix + "c_proj.bias"))


def losses(
    config: GPTConfig, params: dict[str, torch.Tensor], idx: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Each run's mean next-token cross-entropy: idx, targets (S, B, T) -> (S,).

    :meth:`GPT.forward` with targets, per run; ``dropout`` must be 0 (a run's dropout masks would come
    from a generator the others share)."""
    if config.dropout:
        raise ValueError("runs in lockstep need dropout 0")
    S, B, T = idx.shape
    wte = params["transformer.wte.weight"]  # (S, V, E)
    E = wte.shape[-1]
    x = torch.gather(wte, 1, idx.reshape(S, B * T, 1).expand(-1, -1, E))  # (S, B*T, E): wte(idx)
    if not config.rope:
        x = x + params["transformer.wpe.weight"][:, :T].repeat(1, B, 1)  # position t of every sequence
    for layer in range(config.n_layer):
        prefix = f"transformer.h.{layer}."
        bias = params.get  # absent keys: a model without biases
        h = _layer_norm(x, params[prefix + "ln_1.weight"], bias(prefix + "ln_1.bias"))
        x = x + _run_attention(config, h, params, prefix + "attn.", B)
        h = _layer_norm(x, params[prefix + "ln_2.weight"], bias(prefix + "ln_2.bias"))
        h = F.gelu(_run_linear(h, params[prefix + "mlp.c_fc.weight"], bias(prefix + "mlp.c_fc.bias")))
        x = x + _run_linear(h, params[prefix + "mlp.c_proj.weight"], bias(prefix + "mlp.c_proj.bias"))
    x = _layer_norm(x, params["transformer.ln_f.weight"], params.get("transformer.ln_f.bias"))
    head = params["transformer.wte.weight"] if config.tied else params["lm_head.weight"]  # (S, V, E)
    logits = torch.bmm(x, head.transpose(1, 2))  # (S, B*T, V)
    token_losses = F.cross_entropy(logits.reshape(S * B * T, -1), targets.reshape(-1), reduction="none")
    return token_losses.view(S, B * T).mean(dim=1)  # (S,)
