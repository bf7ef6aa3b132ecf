"""Llama-family folders (Llama, Mistral, Qwen2, Gemma): the factor pairs, inspect, balance and prune-biases.

No network: every model is a tiny random one built here from its transformers config class and saved with
``save_pretrained`` (float32, bfloat16, sharded with an index). The convention test shows that the pairs cut
from q/k/v/o_proj and their orbit groups are the ones transformers' models have: a random element of our
group leaves the logits unchanged, a generic GL_D move of a RoPE query-key pair does not.
"""

from __future__ import annotations

import io
import json
import os
import sys

import pandas as pd
import pytest
import torch
import transformers
from variant_models import TINY_HF as TINY

from attnid.cli import main
from attnid.common.errors import UserError
from attnid.edits.checkpoints import HF_LLAMA, load_checkpoint, save_checkpoint
from attnid.edits.hf_llama import load_hf_llama
from attnid.model.layout import orbit_of, pairs_from_tensors, write_layer_pairs
from attnid.reports.inspect_figure import PRECISION_OF_DTYPE
from attnid.reports.round_off import round_off_floor
from attnid.theory.circuits import CIRCUITS
from attnid.theory.orbits import GENERAL_LINEAR

os.environ["HF_HUB_OFFLINE"] = "1"
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

TOLERANCE = 1e-5  # max |logit change| / max |logit| of a float32 folder (docs/design.md §9)
BALANCED = 1e-6  # mu on the own orbit after balance
FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, {}),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),  # q/k/v biases, no o_proj bias
    "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM, {"head_dim": 12}),  # D != E/H
}
SHARD_SIZE = "20KB"  # splits the tiny models into two safetensors shards and an index


def tiny_model(family: str, seed: int = 0, **overrides):
    """A random tiny model of ``family``, off balance: W_Q x 3, W_K / 3, W_V x 2, W_O / 2 (symmetries), and
    non-zero biases where it has them."""
    config_class, model_class, extra = FAMILIES[family]
    torch.manual_seed(seed)
    model = model_class(config_class(**{**TINY, **extra, **overrides})).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            attn.q_proj.weight.mul_(3)
            attn.k_proj.weight.div_(3)
            attn.v_proj.weight.mul_(2)
            attn.o_proj.weight.div_(2)
            for projection in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
                if projection.bias is not None:
                    projection.bias.normal_(0, 0.3)
    return model


@torch.no_grad()
def attention_in_bfloat16(model):
    """The model with its q/k/v/o_proj tensors rounded to bfloat16 (and kept in float32)."""
    for layer in model.model.layers:
        for tensor in layer.self_attn.parameters():
            tensor.copy_(tensor.to(torch.bfloat16).float())
    return model


def save_tiny(family: str, folder, dtype: str = "float32", sharded: bool = False, **overrides):
    model = tiny_model(family, **overrides).to(getattr(torch, dtype))
    model.save_pretrained(folder, **({"max_shard_size": SHARD_SIZE} if sharded else {}))
    return folder


def load(folder, dtype=torch.float32):
    """transformers' own model for a folder, built in ``dtype`` (a bfloat16 weight is exact in float32; built
    in bfloat16, Gemma would round its embedding scale)."""
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), local_files_only=True, dtype=dtype, attn_implementation="eager"
    ).eval()


@torch.no_grad()
def relative_logit_change(edited, original) -> float:
    ids = torch.randint(0, TINY["vocab_size"], (3, 40), generator=torch.Generator().manual_seed(3))
    before, after = original(input_ids=ids).logits, edited(input_ids=ids).logits
    return float((after - before).abs().max() / before.abs().max())


def stored_tensors(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {
        k: v
        for name in sorted(os.listdir(folder))
        if name.endswith(".safetensors")
        for k, v in load_file(folder / name).items()
    }


def run_json(capsys, *argv) -> dict:
    assert main([str(a) for a in argv]) == 0
    return json.loads(capsys.readouterr().out)


def edit(capsys, command: str, folder, out, *flags) -> tuple[dict, str]:
    """Run an edit command; its JSON report and what it printed."""
    report_path = out.parent / f"{out.name}.json"
    assert main([command, str(folder), "--out", str(out), "--json", str(report_path), *flags]) == 0
    return json.loads(report_path.read_text()), capsys.readouterr().out


def closed_forms(tmp_path, capsys, folder) -> dict:
    """``attnid counts --hf-config`` of the folder's config.json: the closed forms inspect must meet."""
    assert main(["counts", "--hf-config", str(folder), "--out", str(tmp_path / "counts.csv")]) == 0
    capsys.readouterr()
    return pd.read_csv(tmp_path / "counts.csv").iloc[0].to_dict()


# --------------------------------------------------------------------------------------
# reading and writing
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_layers_are_the_stacked_projections_and_write_back_is_lossless(tmp_path, family):
    folder = save_tiny(family, tmp_path / "in", "bfloat16", sharded=True)
    model = load(folder)
    checkpoint = load_checkpoint(folder)
    assert checkpoint.kind == HF_LLAMA and checkpoint.stored_dtype() == "bfloat16"
    assert (checkpoint.attention.n_head, checkpoint.attention.n_kv_head) == (4, 2)
    assert checkpoint.attention.head_dim == FAMILIES[family][2].get("head_dim", 8)
    for layer, block in zip(checkpoint.attention_layers(), model.model.layers):
        attn = block.self_attn
        stacked = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).double()
        assert torch.equal(layer.c_attn_weight, stacked)
        assert torch.equal(layer.c_proj_weight, attn.o_proj.weight.double())
        assert (layer.c_attn_bias is not None) == (family == "qwen2") and layer.c_proj_bias is None
    checkpoint.set_attention_layers(checkpoint.attention_layers())
    save_checkpoint(checkpoint, tmp_path / "out")
    assert sorted(os.listdir(tmp_path / "out")) == sorted(os.listdir(folder))
    assert (tmp_path / "out" / "model.safetensors.index.json").read_text() == (
        folder / "model.safetensors.index.json"
    ).read_text()
    before, after = stored_tensors(folder), stored_tensors(tmp_path / "out")
    assert before.keys() == after.keys()
    assert all(after[k].dtype == before[k].dtype and torch.equal(after[k], before[k]) for k in before)


def test_a_pytorch_model_bin_folder_is_balanced_and_written_as_one(tmp_path, capsys):
    from safetensors.torch import load_file

    folder = save_tiny("mistral", tmp_path / "in")
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    report, _ = edit(capsys, "balance", folder, tmp_path / "out")
    assert sorted(os.listdir(tmp_path / "out")) == sorted(os.listdir(folder))
    assert report["mu_qk_after"] < BALANCED and report["max_rel_logit_change"] <= TOLERANCE
    assert relative_logit_change(load(tmp_path / "out"), load(folder)) <= TOLERANCE


# --------------------------------------------------------------------------------------
# the convention: our orbit groups are transformers' symmetries
# --------------------------------------------------------------------------------------


def moved_copy(folder, out, qk_orbit=None, seed: int = 1):
    """Apply a random element of each circuit's own orbit group (or ``qk_orbit`` for the query-key pairs)
    to every pair of every layer; write the folder to ``out``."""
    checkpoint = load_hf_llama(folder)
    layout, generator = checkpoint.attention, torch.Generator().manual_seed(seed)
    layers = checkpoint.attention_layers()
    for layer in layers:
        tensors = (layer.c_attn_weight, layer.c_attn_bias, layer.c_proj_weight)
        for circuit in CIRCUITS:
            orbit = qk_orbit if (circuit == "qk" and qk_orbit is not None) else orbit_of(layout, circuit)
            pair_a, pair_b = pairs_from_tensors(*tensors, layout, circuit)  # (G, D, n)
            element = orbit.random_element((layout.n_kv_head,), layout.head_dim, generator, spread=0.5)
            write_layer_pairs(tensors, layout, circuit, *orbit.act(element, pair_a, pair_b))
    checkpoint.set_attention_layers(layers)
    save_checkpoint(checkpoint, out)
    return out


@pytest.mark.parametrize(
    "family, overrides",
    [
        ("llama", {}),
        ("llama", {"num_key_value_heads": 1}),
        ("llama", {"attention_bias": True}),
        ("mistral", {}),
        ("qwen2", {}),
        ("gemma", {}),
    ],
)
def test_a_random_orbit_element_keeps_the_transformers_logits(tmp_path, family, overrides):
    """float64 folders, so the orbit move is exact to float64 round-off; transformers' RMSNorm computes in
    float32 whatever the model's dtype, which bounds the unchanged logits at float32 resolution."""
    folder = tmp_path / "in"
    tiny_model(family, **overrides).double().save_pretrained(folder)
    original = load(folder, torch.float64)
    moved = load(moved_copy(folder, tmp_path / "own"), torch.float64)
    assert relative_logit_change(moved, original) < 1e-6
    for before, after in zip(original.model.layers, moved.model.layers):  # and the weights did move
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            old, new = (getattr(block.self_attn, name).weight.detach() for block in (before, after))
            assert float((new - old).norm() / old.norm()) > 1e-2
    full_gl = load(moved_copy(folder, tmp_path / "gl", qk_orbit=GENERAL_LINEAR), torch.float64)
    assert relative_logit_change(full_gl, original) > 1e-2  # GL_D is not a symmetry of a RoPE query-key pair


# --------------------------------------------------------------------------------------
# inspect
# --------------------------------------------------------------------------------------

INSPECT_CASES = [
    ("llama", "float32", False),
    ("mistral", "bfloat16", True),
    ("qwen2", "float32", True),
    ("gemma", "bfloat16", False),
    ("qwen2", "bfloat16", False),
]


@pytest.mark.parametrize("family, dtype, sharded", INSPECT_CASES)
def test_inspect_orbit_dimensions_equal_the_closed_forms(tmp_path, capsys, family, dtype, sharded):
    folder = save_tiny(family, tmp_path / "in", dtype, sharded)
    report = run_json(capsys, "inspect", folder, "--json")
    expected = closed_forms(tmp_path, capsys, folder)
    assert report["format"] == HF_LLAMA and report["dtype"] == dtype and report["rope"] is True
    assert report["n_layer"] == TINY["num_hidden_layers"] == len(report["layers"])
    for row in report["layers"]:
        assert row["orbit_qk"] == "rope" and row["orbit_ov"] == "gl"
        head_dim = row["head_dim"]
        assert row["orbit_dim_qk"] == expected["unidentified_qk_per_layer"] == 2 * head_dim  # G D
        assert row["orbit_dim_ov"] == expected["unidentified_ov_per_layer"] == 2 * head_dim**2  # G D^2
        assert row["identified_fraction"] == pytest.approx(expected["identified_fraction"], rel=1e-12)
        assert row["mu_qk"] > 1 and row["mu_ov"] > 1e-2  # the tiny models are built off balance
    assert report["total"]["orbit_matches_closed_form"] is True
    assert report["total"]["unidentified"] == expected["total_unidentified"]
    assert main(["inspect", str(folder), "--csv", "--plot", str(tmp_path / "mu.png")]) == 0
    rows = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert list(rows["orbit_dim_qk"]) == [r["orbit_dim_qk"] for r in report["layers"]]
    assert list(rows["mu_ov"]) == pytest.approx([r["mu_ov"] for r in report["layers"]], rel=1e-12)
    assert (tmp_path / "mu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_inspect_a_gpt2_folder_on_gl_d(tmp_path, capsys):
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=70, n_positions=32)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    report = run_json(capsys, "inspect", tmp_path / "gpt2", "--json")
    assert report["format"] == "hf-gpt2" and report["rope"] is False
    assert [r["orbit_dim_qk"] for r in report["layers"]] == [2 * 8**2] * 2  # H D^2
    assert report["total"]["orbit_matches_closed_form"] is True


# --------------------------------------------------------------------------------------
# balance
# --------------------------------------------------------------------------------------

BALANCE_CASES = [
    (family, dtype, sharded, overrides)
    for family in sorted(FAMILIES)
    for dtype, sharded in (("float32", False), ("bfloat16", True))
    for overrides in [{}]
] + [
    ("llama", "float32", True, {"num_key_value_heads": 1}),
    ("llama", "float32", False, {"attention_bias": True}),
]


@pytest.mark.parametrize("family, dtype, sharded, overrides", BALANCE_CASES)
def test_balance_reaches_mu_zero_on_the_own_orbit(tmp_path, capsys, family, dtype, sharded, overrides):
    folder = save_tiny(family, tmp_path / "in", dtype, sharded, **overrides)
    report, _ = edit(capsys, "balance", folder, tmp_path / "out")
    assert sorted(os.listdir(tmp_path / "out")) == sorted(os.listdir(folder))
    if sharded:
        index = "model.safetensors.index.json"
        assert (tmp_path / "out" / index).read_text() == (folder / index).read_text()
    before, after = stored_tensors(folder), stored_tensors(tmp_path / "out")
    assert before.keys() == after.keys() and all(after[k].dtype == before[k].dtype for k in before)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".self_attn." in k for k in changed)
    plot = tmp_path / "mu.png"
    inspected = run_json(capsys, "inspect", tmp_path / "out", "--json", "--plot", plot)["total"]
    mu_after = max(abs(inspected["mu_qk"]), abs(inspected["mu_ov"]))
    assert mu_after <= BALANCED
    # rounding a balanced pair moves mu at second order only: below the squared unit round-off
    assert mu_after < round_off_floor(PRECISION_OF_DTYPE[dtype], order=2)
    assert plot.stat().st_size > 0
    assert report["mu_qk_before"] > 1 and report["mu_ov_before"] > 1e-2 and report["skipped_pairs"] == 0
    assert report["mu_qk_after"] == pytest.approx(inspected["mu_qk"], abs=1e-12)
    assert report["attn_norm_after"] < report["attn_norm_before"]
    change = relative_logit_change(load(tmp_path / "out"), load(folder))  # our batch; the report has its own
    if dtype == "float32":
        assert max(change, report["max_rel_logit_change"]) <= TOLERANCE
        assert report["write_back_rel_error"] < 1e-7
    else:  # every moved weight rounded to bfloat16 (unit round-off 2^-8): the logits move with it
        assert 2**-12 < report["write_back_rel_error"] < 2**-8
        assert min(change, report["max_rel_logit_change"]) > TOLERANCE
        # ... as much as rounding the float32 model's attention weights to bfloat16 once does
        original = tiny_model(family, **overrides)
        storage = relative_logit_change(attention_in_bfloat16(tiny_model(family, **overrides)), original)
        assert storage / 10 < change < 10 * storage


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_balancing_a_balanced_folder_changes_nothing(tmp_path, capsys, family):
    """docs/design.md §4, §9: balance takes the nearest point of the own orbit (Procrustes on GL_D, the plane
    scales on the RoPE commutant), so balancing a balanced float32 folder moves its attention tensors by
    float32 round-off only."""
    folder = save_tiny(family, tmp_path / "in")
    edit(capsys, "balance", folder, tmp_path / "once")
    edit(capsys, "balance", tmp_path / "once", tmp_path / "twice")
    original, once, twice = (stored_tensors(tmp_path / name) for name in ("in", "once", "twice"))
    attention = [key for key in original if ".self_attn." in key]

    def move(edited, start) -> float:
        moved = sum(float((edited[k].double() - start[k].double()).square().sum()) for k in attention)
        return (moved / sum(float(start[k].double().square().sum()) for k in attention)) ** 0.5

    assert move(once, original) > 1e-2
    assert move(twice, once) < 1e-6


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_balance_a_bfloat16_folder_in_float32(tmp_path, capsys, family):
    folder = save_tiny(family, tmp_path / "in", "bfloat16", sharded=True)
    report, out = edit(capsys, "balance", folder, tmp_path / "out", "--dtype", "float32")
    assert report["input_dtype"] == "bfloat16" and report["stored_dtype"] == "float32"
    assert report["max_rel_logit_change"] <= TOLERANCE
    assert "stored as float32" in out and "rounded to bfloat16" not in out
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "float32"
    stored = stored_tensors(tmp_path / "out")
    assert all(t.dtype == torch.float32 for t in stored.values())
    index, original_index = (
        json.loads((f / "model.safetensors.index.json").read_text()) for f in (tmp_path / "out", folder)
    )
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in stored.values())
    assert index["weight_map"] == original_index["weight_map"]
    inputs = stored_tensors(folder)  # the untouched tensors are the bfloat16 ones, exactly
    assert all(torch.equal(stored[k], inputs[k].float()) for k in stored if ".self_attn." not in k)
    assert relative_logit_change(load(tmp_path / "out"), load(folder)) <= TOLERANCE
    assert (
        max(
            abs(v)
            for k, v in run_json(capsys, "inspect", tmp_path / "out", "--json")["total"].items()
            if k.startswith("mu_")
        )
        <= BALANCED
    )


# --------------------------------------------------------------------------------------
# prune-biases
# --------------------------------------------------------------------------------------


def test_prune_biases_on_qwen2_has_nothing_to_prune(tmp_path, capsys):
    """RoPE: key biases identified, kept; no o_proj bias: value biases cannot be folded, kept. Nothing is
    redundant (as counts says), so nothing is written and the command says why."""
    folder = save_tiny("qwen2", tmp_path / "in")
    expected = closed_forms(tmp_path, capsys, folder)
    assert expected["unidentified_bias_per_layer"] == 0
    before = stored_tensors(folder)
    argv = ["prune-biases", folder, "--out", tmp_path / "out", "--json", tmp_path / "r.json"]
    assert main([str(a) for a in argv]) == 0
    out, err = capsys.readouterr()
    n_layer, group_width = TINY["num_hidden_layers"], 2 * 8  # G D
    kept = n_layer * group_width
    assert f"nothing to prune: its {kept} key biases are identified under RoPE and its {kept} value" in out
    assert "no copy written" in out and err == ""
    assert not (tmp_path / "out").exists() and not (tmp_path / "r.json").exists()
    after = stored_tensors(folder)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_prune_biases_without_biases_writes_nothing(tmp_path, capsys):
    folder = save_tiny("llama", tmp_path / "in")
    capsys.readouterr()
    assert main(["prune-biases", str(folder), "--out", str(tmp_path / "out")]) == 0
    out, err = capsys.readouterr()
    assert "nothing to prune: no attention biases; no copy written" in out and err == ""
    assert not (tmp_path / "out").exists()


def test_prune_biases_folds_grouped_value_biases_into_o_proj(tmp_path, capsys):
    """Llama with attention_bias: the o_proj bias absorbs W_O b_V (each group's b_V once per query head)."""
    folder = save_tiny("llama", tmp_path / "in", attention_bias=True)
    report, _ = edit(capsys, "prune-biases", folder, tmp_path / "out")
    expected = closed_forms(tmp_path, capsys, folder)
    n_layer = TINY["num_hidden_layers"]
    assert report["redundant_params"] == n_layer * expected["unidentified_bias_per_layer"] == n_layer * 2 * 8
    assert report["nonzero_value_biases_folded"] == report["redundant_params"]
    assert report["key_biases_kept"] == 32 and report["value_biases_kept"] == 0
    original, pruned = load(folder), load(tmp_path / "out")
    for before, after in zip(original.model.layers, pruned.model.layers):
        b, a = before.self_attn, after.self_attn
        assert torch.equal(a.v_proj.bias, torch.zeros_like(a.v_proj.bias))
        assert torch.equal(a.k_proj.bias, b.k_proj.bias) and torch.equal(a.q_proj.bias, b.q_proj.bias)
        per_head = b.v_proj.bias.reshape(2, 1, 8).expand(2, 2, 8).reshape(-1)  # repeat_kv's order
        folded = b.o_proj.bias + b.o_proj.weight @ per_head
        torch.testing.assert_close(a.o_proj.bias, folded, rtol=1e-6, atol=1e-7)
    assert relative_logit_change(pruned, original) <= TOLERANCE


# --------------------------------------------------------------------------------------
# one-line errors
# --------------------------------------------------------------------------------------


def _one_line_error(capsys, *argv) -> str:
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("command", ["inspect", "balance", "prune-biases"])
def test_without_the_hf_extra_the_commands_name_it(tmp_path, capsys, monkeypatch, command):
    folder = save_tiny("llama", tmp_path / "in")
    capsys.readouterr()
    monkeypatch.setitem(sys.modules, "safetensors", None)  # import safetensors now raises ImportError
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    monkeypatch.setitem(sys.modules, "transformers", None)
    extra = [] if command == "inspect" else ["--out", tmp_path / "out"]
    assert "pip install 'attnid[hf]'" in _one_line_error(capsys, command, folder, *extra)
    assert not (tmp_path / "out").exists()


def test_bad_folders_are_one_line_errors(tmp_path, capsys):
    folder = save_tiny("llama", tmp_path / "in")
    capsys.readouterr()
    config = json.loads((folder / "config.json").read_text())
    assert "--target initial" in _one_line_error(
        capsys, "balance", folder, "--out", tmp_path / "o", "--target", "initial"
    )
    assert "is also an input" in _one_line_error(capsys, "balance", folder, "--out", folder)
    (folder / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 4}))
    assert "k_proj" in _one_line_error(capsys, "inspect", folder)
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "qwen3"}))
    err = _one_line_error(capsys, "balance", folder, "--out", tmp_path / "o")
    assert "llama, mistral, qwen2, gemma" in err
    (folder / "config.json").write_text(json.dumps({**config, "attention_bias": True}))
    assert "bias" in _one_line_error(capsys, "inspect", folder)
    (folder / "config.json").write_text(json.dumps({**config, "partial_rotary_factor": 0.5}))
    with pytest.raises(UserError, match="partial_rotary_factor"):
        load_hf_llama(folder)
    assert not (tmp_path / "o").exists()


def test_dtype_is_for_llama_family_folders_only(tmp_path, capsys):
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=70, n_positions=32)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    capsys.readouterr()
    assert "Llama-family" in _one_line_error(
        capsys, "balance", tmp_path / "gpt2", "--out", tmp_path / "o", "--dtype", "float32"
    )
