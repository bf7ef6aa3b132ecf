"""``attnid rotate`` (docs/design.md §16): every move on every family keeps the function; refused moves say
why; the canonicalising moves are their own fixed points; an untied copy says what it costs.

No network: each model is a tiny random one (transformers' config classes, attnid's GPT), stored in float64
so that the moves' own exactness is seen (the census's float64 forward, ``exact_max_abs_dlogp`` of the
report, at most 1e-10) apart from what each family's own forward resolves (transformers' RMSNorm computes
in float32 whatever the dtype: the written folder, loaded by ``from_pretrained``, within 1e-4).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import transformers
from variant_models import TINY_HF

from attnid.cli import main
from attnid.edits.orthogonal import hadamard, stream_rotation
from attnid.model.gpt import GPT, GPTConfig, load_nanogpt_checkpoint

os.environ["HF_HUB_OFFLINE"] = "1"
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

EXACT = 1e-10  # max |delta log p| of the moves in float64 (the census's forward)
AS_WRITTEN = 1e-4  # the family's own forward in float32, the written copy against the input
HF_FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, {}),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),  # q/k/v biases
    "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM, {"head_dim": 12}),  # tied, D != E/H
}
NANOGPT = {
    "nanogpt": {},  # LayerNorm without bias, tied, learned positions
    "nanogpt-bias": {"bias": True},
    "nanogpt-rope-gqa": {"rope": True, "n_kv_head": 2},
}
FAMILIES = [*HF_FAMILIES, "gpt2", *NANOGPT]
MOVES = ["fuse-norms", "residual", "qk", "ov", "smooth"]


@torch.no_grad()
def _off_the_orbit_point(model: torch.nn.Module) -> None:
    """Norm gains in [0.5, 1.5] and non-zero biases: fusing and scaling them must be seen."""
    for name, parameter in model.named_parameters():
        normed = "norm" in name or ".ln_" in name or name.startswith("ln_")
        if normed and name.endswith("weight"):
            parameter.uniform_(0.5, 1.5)
        elif name.endswith("bias"):
            parameter.normal_(0, 0.3)


def _save(family: str, folder, dtype=torch.float64):
    torch.manual_seed(0)
    if family in NANOGPT:
        config = GPTConfig(block_size=32, vocab_size=65, n_layer=2, n_head=4, n_embd=32, dropout=0.0)
        for key, value in {"bias": False, **NANOGPT[family]}.items():
            setattr(config, key, value)
        model = GPT(config)
        _off_the_orbit_point(model)
        state = {k: v.to(dtype) for k, v in model.state_dict().items()}
        torch.save({"model_args": config.model_args(), "model": state}, folder)
        return folder
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=4)
        model = transformers.GPT2LMHeadModel(config).eval()
    else:
        config_class, model_class, extra = HF_FAMILIES[family]
        model = model_class(config_class(**{**TINY_HF, **extra})).eval()
    _off_the_orbit_point(model)
    model.to(dtype).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("rotate")
    return {f: _save(f, root / (f"{f}.pt" if f in NANOGPT else f)) for f in FAMILIES}


def _log_probs(family: str, path, ids: torch.Tensor) -> torch.Tensor:
    """The family's own model of ``path`` in float32: transformers' ``from_pretrained``, attnid's GPT."""
    with torch.no_grad():
        if family in NANOGPT:
            model = load_nanogpt_checkpoint(path).float()
            logits = model(ids, full_logits=True)[0]
        else:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(path), local_files_only=True, dtype=torch.float32, attn_implementation="eager"
            ).eval()
            logits = model(input_ids=ids).logits
    return logits.log_softmax(-1)


def _rotate(path, out, *flags, text=None) -> dict:
    report = out.parent / f"{out.name}.json"
    argv = ["rotate", str(path), "--out", str(out), "--json", str(report), "--length", "32"]
    argv += ["--calibration-tokens", "96", *(["--text", str(text)] if text else []), *map(str, flags)]
    assert main(argv) == 0
    return json.loads(report.read_text())


@pytest.mark.parametrize("family", FAMILIES)
def test_every_move_keeps_the_function(family, inputs, tmp_path, shakespeare_path, capsys):
    ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(1))
    before = _log_probs(family, inputs[family], ids)
    for move in MOVES:
        out = tmp_path / (f"{move}.pt" if family in NANOGPT else move)
        report = _rotate(inputs[family], out, "--moves", move, text=shakespeare_path)
        assert report["exact_max_abs_dlogp"] <= EXACT, (family, move, report["exact_max_abs_dlogp"])
        change = float((_log_probs(family, out, ids) - before).abs().max())
        assert change <= AS_WRITTEN, (family, move, change)
    capsys.readouterr()


def test_all_moves_at_once_keep_a_float32_folder_within_1e_4(tmp_path, shakespeare_path, capsys):
    folder = _save("llama", tmp_path / "llama32", dtype=torch.float32)
    ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(2))
    report = _rotate(
        folder, tmp_path / "out", "--moves", ",".join(MOVES), "--pick-seed", "2", text=shakespeare_path
    )
    assert report["stored_dtype"] == "float32" and report["max_abs_dlogp"] <= AS_WRITTEN
    change = float(
        (_log_probs("llama", tmp_path / "out", ids) - _log_probs("llama", folder, ids)).abs().max()
    )
    assert change <= AS_WRITTEN
    assert set(report["seed_scores"]) == {"0", "1"} and report["residual_seed"] in (0, 1)
    capsys.readouterr()


def _tensors(family: str, path) -> dict[str, torch.Tensor]:
    if family in NANOGPT:
        return dict(torch.load(path, weights_only=True)["model"])
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


@pytest.mark.parametrize(
    "family, moves", [("llama", "fuse-norms,qk,ov,smooth"), ("nanogpt-bias", "fuse-norms,ov,smooth")]
)
def test_canonical_moves_are_their_own_fixed_points(
    family, moves, inputs, tmp_path, shakespeare_path, capsys
):
    """Twice equals once: the second application moves no tensor by more than the round-off of its
    statistics (taken on the model's own forward, whose norms transformers computes in float32: 1e-5
    relative)."""
    suffix = ".pt" if family in NANOGPT else ""
    once = tmp_path / f"once{suffix}"
    twice = tmp_path / f"twice{suffix}"
    _rotate(inputs[family], once, "--moves", moves, text=shakespeare_path)
    _rotate(once, twice, "--moves", moves, text=shakespeare_path)
    first, second = _tensors(family, once), _tensors(family, twice)
    for key, tensor in first.items():
        scale = float(tensor.abs().max()) or 1.0
        assert float((second[key] - tensor).abs().max()) / scale <= 1e-5, key
    capsys.readouterr()


def test_a_seeded_rotation_twice_is_its_square(inputs, tmp_path, capsys):
    """What repeated application of a random move means: R1 twice is R1 R1, not R1 (module docstring of
    attnid.edits.quant_moves)."""
    once, twice = tmp_path / "once", tmp_path / "twice"
    _rotate(inputs["llama"], once, "--moves", "residual")
    _rotate(once, twice, "--moves", "residual")
    rotation = stream_rotation(32, "hadamard", 0, fix_mean=False)
    first, second = _tensors("llama", once), _tensors("llama", twice)
    embedding = "model.embed_tokens.weight"
    assert torch.allclose(second[embedding], first[embedding] @ rotation.T, atol=1e-12)
    assert not torch.allclose(second[embedding], first[embedding], atol=1e-3)
    capsys.readouterr()


def _refused(capsys, *argv) -> str:
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


@pytest.mark.parametrize("family, cost", [("gemma", 2048), ("gpt2", 2048), ("nanogpt", 2080)])
def test_a_tied_model_is_untied_at_its_cost_or_refused_with_the_census_class(
    family, cost, inputs, tmp_path, capsys
):
    out = tmp_path / ("o.pt" if family in NANOGPT else "o")
    err = _refused(capsys, "rotate", inputs[family], "--out", out, "--moves", "residual", "--keep-tied")
    assert "stream_rotation" in err and f"+{cost:,} parameters" in err and "--keep-tied" in err
    assert not out.exists()
    report = _rotate(inputs[family], out, "--moves", "residual")
    assert report["untied_params"] == cost
    assert f"+{cost:,} parameters" in capsys.readouterr().out


def test_refusals_are_one_line(inputs, tmp_path, capsys):
    assert "choose among" in _refused(
        capsys, "rotate", inputs["llama"], "--out", tmp_path / "o", "--moves", "spin"
    )
    config = GPTConfig(block_size=16, vocab_size=65, n_layer=1, n_head=2, n_embd=22, dropout=0.0, bias=False)
    torch.save({"model_args": config.model_args(), "model": GPT(config).state_dict()}, tmp_path / "e22.pt")
    assert hadamard(22) is None
    err = _refused(capsys, "rotate", tmp_path / "e22.pt", "--out", tmp_path / "o.pt", "--moves", "residual")
    assert "E=22" in err and "--residual random" in err
    assert (
        main(
            [
                "rotate",
                str(tmp_path / "e22.pt"),
                "--out",
                str(tmp_path / "o.pt"),
                "--moves",
                "residual",
                "--residual",
                "random",
            ]
        )
        == 0
    )
    capsys.readouterr()


def test_layernorm_rotations_fix_the_mean_direction():
    for kind in ("hadamard", "random"):
        rotation = stream_rotation(32, kind, 3, fix_mean=True)
        ones = torch.ones(32, dtype=torch.float64)
        assert torch.allclose(rotation @ ones, ones, atol=1e-12)
        assert torch.allclose(rotation @ rotation.T, torch.eye(32, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("order", [2, 12, 20, 36, 64, 576, 768])
def test_hadamard_matrices_are_orthogonal_with_equal_magnitudes(order):
    matrix = hadamard(order)
    assert matrix is not None
    assert torch.allclose(matrix @ matrix.T, torch.eye(order, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(matrix.abs(), torch.full_like(matrix, order**-0.5))
