"""Hugging Face models: counts from a config.json, and prune-biases / balance on GPT-2 folders.

No network: the configs are written here with the published fields of each model, and
the GPT-2 model is a tiny random one saved with ``save_pretrained``.
"""

from __future__ import annotations

import json
import os
import pickle

import pandas as pd
import pytest
import torch
import transformers

from attnid.cli import main
from attnid.cli.theory import load_architectures
from attnid.common.errors import UserError
from attnid.model.layout import pairs_from_tensors
from attnid.theory import architectures, factor_pairs
from attnid.theory.hf_config import architecture_from_hf_config
from attnid.theory.shape import layer_shape

TOLERANCE = 1e-5
TINY = dict(n_layer=2, n_head=2, n_embd=16, vocab_size=70, n_positions=32, bos_token_id=0, eos_token_id=0)

# config.json fields as published on the Hugging Face hub (attention-relevant ones, plus a few others)
PUBLISHED_CONFIGS = {
    "GPT-2 124M": {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_embd": 768,
        "n_head": 12,
        "n_layer": 12,
        "n_positions": 1024,
        "n_ctx": 1024,
        "vocab_size": 50257,
        "activation_function": "gelu_new",
    },
    "Llama-2 70B": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_attention_heads": 64,
        "num_hidden_layers": 80,
        "num_key_value_heads": 8,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "vocab_size": 32000,
    },
    "Mistral-7B": {
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "rope_theta": 10000.0,
        "sliding_window": 4096,
        "vocab_size": 32000,
    },
    "Qwen2-7B": {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "rope_theta": 1000000.0,
        "vocab_size": 152064,
    },
    "Falcon-7B": {
        "model_type": "falcon",
        "architectures": ["FalconForCausalLM"],
        "hidden_size": 4544,
        "num_attention_heads": 71,
        "num_hidden_layers": 32,
        "multi_query": True,
        "new_decoder_architecture": False,
        "alibi": False,
        "bias": False,
        "parallel_attn": True,
        "vocab_size": 65024,
    },
    "Gemma-7B": {
        "model_type": "gemma",
        "architectures": ["GemmaForCausalLM"],
        "hidden_size": 3072,
        "intermediate_size": 24576,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "head_dim": 256,
        "num_hidden_layers": 28,
        "rope_theta": 10000.0,
        "vocab_size": 256000,
    },
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_CONFIGS))
def test_hf_config_counts_equal_the_architecture_table(name, tmp_path, repo_root, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(PUBLISHED_CONFIGS[name]))
    assert main(["counts", "--hf-config", str(folder), "--out", str(tmp_path / "row.csv")]) == 0
    assert "total_unidentified" in capsys.readouterr().out
    ours = pd.read_csv(tmp_path / "row.csv").iloc[0].to_dict()
    spec = load_architectures()[name]
    expected = pd.DataFrame([architectures.architecture_row(name, spec)]).iloc[0].to_dict()
    compared = set(expected) - {"architecture", "source"}
    assert {k: ours[k] for k in compared} == {k: expected[k] for k in compared}


def test_hf_config_variants():
    falcon_40b = {
        "model_type": "falcon",
        "hidden_size": 8192,
        "num_attention_heads": 128,
        "num_hidden_layers": 60,
        "new_decoder_architecture": True,
        "num_kv_heads": 8,
    }
    assert architecture_from_hf_config(falcon_40b)["n_kv_head"] == 8
    assert architecture_from_hf_config({**falcon_40b, "alibi": True})["rope"] is False
    llama_bias = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "attention_bias": True,
    }
    spec = architecture_from_hf_config(llama_bias)
    assert spec["bias"] and spec["out_bias"] and spec["n_kv_head"] == 4 and spec["rope"]
    qwen = architecture_from_hf_config({**llama_bias, "model_type": "qwen2", "attention_bias": None})
    assert qwen["bias"] and not qwen["out_bias"]


def test_hf_config_that_cannot_be_mapped_is_one_line(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32}))
    assert main(["counts", "--hf-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "num_hidden_layers" in err and len(err.strip().splitlines()) == 1
    path.write_text(json.dumps({"model_type": "bert", "hidden_size": 768}))
    with pytest.raises(UserError, match="bert"):
        architecture_from_hf_config(json.loads(path.read_text()))


# --------------------------------------------------------------------------------------
# GPT-2 folders
# --------------------------------------------------------------------------------------


def tiny_gpt2(folder, weights: str = "safetensors"):
    """A random tiny GPT-2 with non-zero biases, saved with save_pretrained (or as pytorch_model.bin)."""
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**TINY)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(folder)
    if weights == "bin":
        from safetensors.torch import load_file

        torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink()
    return model


def load_gpt2(folder):
    return transformers.GPT2LMHeadModel.from_pretrained(str(folder), local_files_only=True).eval()


@torch.no_grad()
def relative_logit_change(edited, original) -> float:
    ids = torch.randint(
        0, TINY["vocab_size"], (3, TINY["n_positions"]), generator=torch.Generator().manual_seed(3)
    )
    before, after = original(input_ids=ids).logits, edited(input_ids=ids).logits
    return float((after - before).abs().max() / before.abs().max())


@pytest.mark.parametrize("weights", ["safetensors", "bin"])
def test_prune_biases_on_a_gpt2_folder(tmp_path, weights):
    original = tiny_gpt2(tmp_path / "gpt2", weights)
    assert (
        main(
            [
                "prune-biases",
                str(tmp_path / "gpt2"),
                "--out",
                str(tmp_path / "pruned"),
                "--json",
                str(tmp_path / "r.json"),
            ]
        )
        == 0
    )
    assert sorted(os.listdir(tmp_path / "pruned")) == sorted(os.listdir(tmp_path / "gpt2"))
    pruned = load_gpt2(tmp_path / "pruned")
    assert relative_logit_change(pruned, original) <= TOLERANCE
    n_embd = TINY["n_embd"]
    for edited, before in zip(pruned.transformer.h, original.transformer.h):
        assert torch.equal(edited.attn.c_attn.bias[n_embd:], torch.zeros(2 * n_embd))
        # Conv1D computes x W + b, so the value bias reaches the output as b_V W_O
        folded = before.attn.c_proj.bias + before.attn.c_attn.bias[2 * n_embd :] @ before.attn.c_proj.weight
        torch.testing.assert_close(edited.attn.c_proj.bias, folded, rtol=1e-6, atol=1e-7)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["format"] == "hf-gpt2" and report["redundant_params"] == TINY["n_layer"] * 2 * n_embd
    assert report["max_rel_logit_change"] <= TOLERANCE


@torch.no_grad()
def pairs_of(model, circuit):
    """Pairs in nanoGPT's layout: Conv1D weights are the transposes."""
    n_embd, n_head = TINY["n_embd"], TINY["n_head"]
    layout = layer_shape(n_embd, n_head, bias=True)
    return [
        pairs_from_tensors(
            block.attn.c_attn.weight.t(),
            block.attn.c_attn.bias,
            block.attn.c_proj.weight.t(),
            layout,
            circuit,
        )
        for block in model.transformer.h
    ]


def test_balance_and_prune_on_a_gpt2_folder(tmp_path):
    original = tiny_gpt2(tmp_path / "gpt2")
    assert main(["balance", str(tmp_path / "gpt2"), "--out", str(tmp_path / "balanced")]) == 0
    assert main(["prune-biases", str(tmp_path / "balanced"), "--out", str(tmp_path / "both")]) == 0
    for folder in ("balanced", "both"):
        edited = load_gpt2(tmp_path / folder)
        assert relative_logit_change(edited, original) <= TOLERANCE
    balanced = load_gpt2(tmp_path / "balanced")
    for circuit in ("qk", "ov"):
        for (pair_a, pair_b), (old_a, old_b) in zip(pairs_of(balanced, circuit), pairs_of(original, circuit)):
            scale = float(factor_pairs.gram(pair_a).abs().max())
            assert float(factor_pairs.imbalance(old_a, old_b).abs().max()) > 1e-3 * scale  # it was unbalanced
            assert float(factor_pairs.imbalance(pair_a, pair_b).abs().max()) < 1e-5 * scale


def test_balancing_a_balanced_gpt2_folder_changes_nothing(tmp_path):
    """docs/design.md §4, §9: the nearest balanced point of a balanced folder is the folder itself."""
    tiny_gpt2(tmp_path / "gpt2")
    assert main(["balance", str(tmp_path / "gpt2"), "--out", str(tmp_path / "once")]) == 0
    assert main(["balance", str(tmp_path / "once"), "--out", str(tmp_path / "twice")]) == 0
    original, once, twice = (load_gpt2(tmp_path / name) for name in ("gpt2", "once", "twice"))

    def move(edited, start) -> float:
        """Relative Frobenius change of the attention tensors."""
        attention = [
            (a.detach().double(), b.detach().double())
            for (name, a), (_, b) in zip(edited.named_parameters(), start.named_parameters(), strict=True)
            if ".attn.c_attn." in name or ".attn.c_proj." in name
        ]
        moved = sum(float((a - b).square().sum()) for a, b in attention)
        return (moved / sum(float(b.square().sum()) for _, b in attention)) ** 0.5

    assert move(once, original) > 1e-2
    assert move(twice, once) < 1e-6


def test_initial_target_needs_an_attnid_checkpoint(tmp_path, capsys):
    tiny_gpt2(tmp_path / "gpt2")
    assert main(["balance", str(tmp_path / "gpt2"), "--out", str(tmp_path / "x"), "--target", "initial"]) == 2
    assert "I_0" in capsys.readouterr().err and not (tmp_path / "x").exists()


class RunsShell:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


def test_code_carrying_pytorch_model_bin_is_refused(tmp_path, capsys):
    tiny_gpt2(tmp_path / "gpt2", "bin")
    capsys.readouterr()  # save_pretrained's progress bar (shown unless an earlier test turned it off)
    state = torch.load(tmp_path / "gpt2" / "pytorch_model.bin", weights_only=True)
    marker = tmp_path / "marker"
    (tmp_path / "gpt2" / "pytorch_model.bin").write_bytes(
        pickle.dumps({**state, "payload": RunsShell(marker)})
    )
    for command in ("prune-biases", "balance"):
        assert main([command, str(tmp_path / "gpt2"), "--out", str(tmp_path / command)]) == 2
        err = capsys.readouterr().err
        assert "refused" in err and len(err.strip().splitlines()) == 1
    assert not marker.exists()
