"""The model is nanoGPT's: names, init, forward, and checkpoints that load with the same logits."""

from __future__ import annotations

import math

import pytest
import torch
from reference_forward import reference_logits
from torch.nn import functional as F

from attnid.common.errors import UserError
from attnid.model.gpt import GPT, GPTConfig, load_nanogpt_checkpoint

TINY = dict(block_size=16, vocab_size=23, n_layer=2, n_head=4, n_embd=32, dropout=0.0)


def _tiny(bias: bool, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**TINY, bias=bias))


def test_parameter_names_are_nanogpts():
    model = _tiny(bias=True)
    names = set(model.state_dict())
    expected = {
        "transformer.wte.weight",
        "transformer.wpe.weight",
        "transformer.ln_f.weight",
        "transformer.ln_f.bias",
        "lm_head.weight",
    }
    for i in range(2):
        for part in ("ln_1", "ln_2", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
            expected |= {f"transformer.h.{i}.{part}.weight", f"transformer.h.{i}.{part}.bias"}
    assert names == expected
    assert model.transformer.h[0].attn.c_attn.weight.shape == (3 * 32, 32)
    assert model.lm_head.weight is model.transformer.wte.weight  # tied
    no_bias = set(_tiny(bias=False).state_dict())
    assert not any(n.endswith(".bias") for n in no_bias)


def test_init_scales_residual_projections():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=50, n_layer=8, n_head=4, n_embd=128, bias=True))
    c_proj_std = torch.cat([b.attn.c_proj.weight.flatten() for b in model.transformer.h]).std().item()
    c_attn_std = torch.cat([b.attn.c_attn.weight.flatten() for b in model.transformer.h]).std().item()
    assert c_proj_std == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert c_attn_std == pytest.approx(0.02, rel=0.05)
    assert torch.all(model.transformer.h[0].attn.c_attn.bias == 0)
    groups = model.optimizer_groups(0.1)
    assert sum(p.numel() for g in groups for p in g["params"]) == sum(p.numel() for p in model.parameters())
    assert all(p.dim() >= 2 for p in groups[0]["params"]) and all(p.dim() < 2 for p in groups[1]["params"])


def test_forward_shapes_loss_and_causality():
    model = _tiny(bias=False).eval()
    idx = torch.randint(0, 23, (3, 16), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, 23, (3, 16), generator=torch.Generator().manual_seed(2))
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 16, 23)
    assert loss.item() == pytest.approx(F.cross_entropy(logits.reshape(-1, 23), targets.reshape(-1)).item())
    last, none = model(idx)
    assert none is None and last.shape == (3, 1, 23)
    torch.testing.assert_close(last[:, 0], logits[:, -1])
    full, _ = model(idx, full_logits=True)
    torch.testing.assert_close(full, logits)
    # changing the last token must not change any earlier position's logits
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 23
    full_changed, _ = model(changed, full_logits=True)
    torch.testing.assert_close(full_changed[:, :-1], full[:, :-1])
    assert not torch.allclose(full_changed[:, -1], full[:, -1])


@pytest.mark.parametrize("bias", [True, False])
def test_nanogpt_checkpoint_round_trip(tmp_path, bias):
    """A checkpoint in nanoGPT's format, saved by a compiled model, loads with the reference logits."""
    model = _tiny(bias=bias, seed=3)
    with torch.no_grad():  # move biases and LayerNorms off their init so every tensor matters
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    args = model.config.model_args()
    raw = {k: v.clone() for k, v in model.state_dict().items()}
    checkpoint = {
        "model": {"_orig_mod." + k: v for k, v in raw.items()},
        "optimizer": {},
        "model_args": dict(args),
        "iter_num": 5000,
        "best_val_loss": torch.tensor(1.47),
        "config": {"dataset": "shakespeare_char", "compile": True},
    }
    path = tmp_path / "ckpt.pt"
    torch.save(checkpoint, path)

    loaded = load_nanogpt_checkpoint(path)
    assert not loaded.training
    assert loaded.config == GPTConfig(**args)
    idx = torch.randint(0, 23, (4, 16), generator=torch.Generator().manual_seed(4))
    ours, _ = loaded(idx, full_logits=True)
    expected = reference_logits(raw, args, idx)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    last, _ = loaded(idx)
    torch.testing.assert_close(last[:, 0], expected[:, -1], rtol=1e-5, atol=1e-5)
    assert loaded.lm_head.weight is loaded.transformer.wte.weight

    # and our own save (no prefix) loads too
    torch.save({"model": loaded.state_dict(), "model_args": args}, tmp_path / "ours.pt")
    again, _ = load_nanogpt_checkpoint(tmp_path / "ours.pt")(idx, full_logits=True)
    torch.testing.assert_close(again, ours, rtol=0, atol=0)


def test_bad_checkpoints_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_nanogpt_checkpoint(tmp_path / "nope.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="cannot read"):
        load_nanogpt_checkpoint(tmp_path / "junk.pt")
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(UserError, match="model_args"):
        load_nanogpt_checkpoint(tmp_path / "other.pt")
    model = _tiny(bias=False)
    wrong = dict(model.config.model_args(), n_embd=64, n_head=4)
    torch.save({"model": model.state_dict(), "model_args": wrong}, tmp_path / "wrong.pt")
    # the first tensor that disagrees, its shape and the shape model_args imply (before any model is built)
    with pytest.raises(
        UserError,
        match=r"tensor transformer\.wte\.weight has shape \(23, 32\), "
        r"expected \(23, 64\) from its model_args; 15 more",
    ):
        load_nanogpt_checkpoint(tmp_path / "wrong.pt")
    with pytest.raises(UserError, match="is a directory"):
        load_nanogpt_checkpoint(tmp_path)


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"bias": False},
        {"rope": True},
        {"n_kv_head": 2},
        {"head_dim": 6},
        {"rope": True, "n_kv_head": 1, "bias": False, "head_dim": 4},
    ],
)
def test_expected_state_shapes_are_the_built_models(variant):
    """The shapes the checkpoint readers check against (without building a model) are a built model's."""
    from attnid.model.gpt import expected_state_shapes, parameter_count

    config = GPTConfig(**{**dict(block_size=8, vocab_size=11, n_layer=2, n_head=4, n_embd=16), **variant})
    model = GPT(config)
    assert expected_state_shapes(config) == {name: tuple(t.shape) for name, t in model.state_dict().items()}
    assert parameter_count(config) == sum(p.numel() for p in model.parameters())
