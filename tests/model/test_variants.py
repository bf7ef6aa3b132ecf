"""Model variants (GQA, RoPE, head_dim): forward/backward, layout, checkpoints, and an
independent reference forward (nullity.attention_layer) for the attention layer."""

from __future__ import annotations

import pytest
import torch
from variant_models import TINY
from variant_models import VARIANTS as ALL_VARIANTS

from attnid.model.gpt import GPT, GPTConfig, load_nanogpt_checkpoint
from attnid.model.layout import attention_tensors, layout_of, pairs_from_tensors, stacked_pairs
from attnid.theory import counts, nullity
from attnid.theory.circuits import CIRCUITS

# the variants only: the stock model has tests of its own (test_model.py)
VARIANTS = {name: fields for name, fields in ALL_VARIANTS.items() if fields}
NANOGPT_ARGS = {"block_size", "vocab_size", "n_layer", "n_head", "n_embd", "dropout", "bias"}


def _model(variant: dict, bias: bool = True, seed: int = 0, dtype=torch.float32) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**TINY, **variant}, bias=bias)).to(dtype)
    with torch.no_grad():  # move biases and LayerNorms off their init so every tensor matters
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_forward_backward_and_causality(name):
    model = _model(VARIANTS[name], bias=name != "rope").eval()
    idx = torch.randint(0, 23, (3, 16), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, 23, (3, 16), generator=torch.Generator().manual_seed(2))
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 16, 23) and torch.isfinite(loss)
    loss.backward()
    for param_name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), param_name
        assert param.grad.abs().sum() > 0, param_name
    with torch.no_grad():
        full, _ = model(idx, full_logits=True)
        changed = idx.clone()
        changed[:, -1] = (changed[:, -1] + 1) % 23
        full_changed, _ = model(changed, full_logits=True)
    torch.testing.assert_close(full_changed[:, :-1], full[:, :-1])
    assert not torch.allclose(full_changed[:, -1], full[:, -1])


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_layout_and_parameter_names(name):
    variant = VARIANTS[name]
    config = GPTConfig(**{**TINY, **variant})
    model = GPT(config)
    h, g, d, e = config.n_head, config.kv_heads, config.per_head_dim, config.n_embd
    attn = model.transformer.h[0].attn
    assert attn.c_attn.weight.shape == (h * d + 2 * g * d, e)
    assert attn.c_attn.bias.shape == (h * d + 2 * g * d,)
    assert attn.c_proj.weight.shape == (e, h * d)
    stock = set(GPT(GPTConfig(**TINY)).state_dict())
    names = set(model.state_dict())
    if config.rope:
        assert names == stock - {"transformer.wpe.weight"}
    else:
        assert names == stock
    # counts.py's weight count of this layer shape is what the model holds
    shape = counts.layer_shape(e, h, g, d, d, config.rope, True, True)
    attn_params = sum(p.numel() for p in attn.parameters())
    assert attn_params == counts.attention_params_per_layer(shape)


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("bias", [True, False])
def test_attention_matches_independent_reference(name, bias):
    """The layer equals nullity.attention_layer (explicit matmuls, repeat_interleave GQA,
    half-split RoPE base 10000) fed with W_Q, W_K, W_V, W_O cut from c_attn / c_proj by the
    documented layout."""
    config = GPTConfig(**{**TINY, **VARIANTS[name]}, bias=bias)
    attn = _model(VARIANTS[name], bias=bias, dtype=torch.float64).transformer.h[1].attn.eval()
    h, g, d = config.n_head, config.kv_heads, config.per_head_dim
    weight = attn.c_attn.weight.detach()
    w_q, w_k, w_v = weight.split([h * d, g * d, g * d])
    params = {"w_q": w_q, "w_k": w_k, "w_v": w_v, "w_o": attn.c_proj.weight.detach()}
    if bias:
        b_q, b_k, b_v = attn.c_attn.bias.detach().split([h * d, g * d, g * d])
        params.update(b_q=b_q, b_k=b_k, b_v=b_v, b_o=attn.c_proj.bias.detach())
    shape = counts.LayerShape(config.n_embd, h, g, d, d, config.rope, bias, bias)
    x = torch.randn(2, 9, config.n_embd, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    reference = nullity.attention_layer(
        x, params, shape, rope="half" if config.rope else None, rope_base=10000.0
    )
    with torch.no_grad():
        torch.testing.assert_close(attn(x), reference, rtol=1e-10, atol=1e-12)


def test_rope_model_sees_order_without_a_position_embedding():
    """Without wpe, one causal attention layer at the last position is blind to the order of
    the earlier tokens; RoPE alone must make it see that order."""
    rope = _model(dict(VARIANTS["rope"], n_layer=1), dtype=torch.float64).eval()
    assert "wpe" not in rope.transformer
    assert rope.get_num_params() == sum(p.numel() for p in rope.parameters())
    no_positions = _model(dict(n_layer=1), dtype=torch.float64).eval()
    with torch.no_grad():
        no_positions.transformer.wpe.weight.zero_()
    idx = torch.randint(0, 23, (2, 10), generator=torch.Generator().manual_seed(3))
    swapped = idx.clone()
    swapped[:, [0, 1]] = idx[:, [1, 0]]
    assert not torch.equal(idx, swapped)
    with torch.no_grad():
        torch.testing.assert_close(no_positions(swapped)[0], no_positions(idx)[0], rtol=1e-10, atol=1e-12)
        assert (rope(swapped)[0] - rope(idx)[0]).abs().max() > 1e-6


def test_stock_model_args_are_nanogpts_and_variants_round_trip(tmp_path):
    stock = GPTConfig(**TINY)
    assert set(stock.model_args()) == NANOGPT_ARGS  # nanoGPT's GPTConfig(**model_args) accepts it
    for name, variant in VARIANTS.items():
        model = _model(variant, seed=7)
        args = model.config.model_args()
        assert GPTConfig(**args) == model.config, name
        path = tmp_path / f"variant{len(list(tmp_path.iterdir()))}.pt"
        torch.save(
            {"model": {"_orig_mod." + k: v for k, v in model.state_dict().items()}, "model_args": args}, path
        )
        loaded = load_nanogpt_checkpoint(path)
        assert loaded.config == model.config, name
        idx = torch.randint(0, 23, (2, 16), generator=torch.Generator().manual_seed(4))
        expected, _ = model.eval()(idx, full_logits=True)
        got, _ = loaded(idx, full_logits=True)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_variant_checkpoint_with_wrong_args_is_a_user_error(tmp_path):
    from attnid.common.errors import UserError

    model = _model(VARIANTS["gqa G=2"])
    args = dict(model.config.model_args())
    del args["n_kv_head"]  # an MHA model_args cannot hold these narrower c_attn rows
    torch.save({"model": model.state_dict(), "model_args": args}, tmp_path / "bad.pt")
    with pytest.raises(UserError, match=r"c_attn\.weight has shape \(64, 32\), expected \(96, 32\)"):
        load_nanogpt_checkpoint(tmp_path / "bad.pt")


@pytest.mark.parametrize(
    "variant, message",
    [
        (dict(n_kv_head=3), "must divide n_head"),
        (dict(rope=True, head_dim=5), "even head_dim"),
        (dict(n_embd=30), "multiple of n_head"),
    ],
)
def test_bad_variant_configs_are_rejected(variant, message):
    with pytest.raises(ValueError, match=message):
        GPT(GPTConfig(**{**TINY, **variant}))


def test_stock_config_is_bit_identical_to_before():
    """Variant fields at their defaults build the same modules from the same seed."""
    torch.manual_seed(11)
    plain = GPT(GPTConfig(**TINY))
    torch.manual_seed(11)
    explicit = GPT(GPTConfig(**TINY, n_kv_head=4, head_dim=8, rope=False))
    for (name, a), (_, b) in zip(plain.state_dict().items(), explicit.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    idx = torch.randint(0, 23, (2, 16), generator=torch.Generator().manual_seed(4))
    loss_a = plain(idx, idx)[1]
    loss_b = explicit(idx, idx)[1]
    assert loss_a.item() == loss_b.item()


@pytest.mark.parametrize("name", list(ALL_VARIANTS))
@pytest.mark.parametrize("bias", [True, False])
def test_stacked_pairs_are_each_layers_pairs_one_after_another(name, bias):
    """stacked_pairs (written into place, the metrics' every-step read) holds exactly pairs_from_tensors'
    pairs of each layer, concatenated, for every variant, with and without biases, in float64 and float32,
    from the live tensors and from a float64 copy of them."""
    model = _model(ALL_VARIANTS[name], bias=bias)
    layout = layout_of(model)
    live = attention_tensors(model)
    copied = [tuple(None if t is None else t.detach().double() for t in layer) for layer in live]
    for tensors in (live, copied):
        for circuit in CIRCUITS:
            for dtype in (torch.float64, torch.float32):
                per_layer = [pairs_from_tensors(*layer, layout, circuit, dtype) for layer in tensors]
                pair_a, pair_b = stacked_pairs(tensors, layout, circuit, dtype)
                assert pair_a.dtype == pair_b.dtype == dtype and pair_a.is_contiguous()
                assert torch.equal(pair_a, torch.cat([a for a, _ in per_layer]))
                assert torch.equal(pair_b, torch.cat([b for _, b in per_layer]))
