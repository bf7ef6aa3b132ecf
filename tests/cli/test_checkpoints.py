"""attnid prune-biases / balance on nanoGPT checkpoints, and weights-only loading of every checkpoint a
user hands us.

The edits are exact (docs/design.md §9): the edited checkpoint, loaded back with
``load_nanogpt_checkpoint``, gives the original logits to float32 round-off.
"""

from __future__ import annotations

import builtins
import json
import os
import pickle

import pytest
import torch
from reference_forward import reference_logits

from attnid.cli import main
from attnid.common.errors import UserError
from attnid.common.files import load_weights_only
from attnid.edits.checkpoints import load_checkpoint
from attnid.measure.inspect import inspect_model
from attnid.model.gpt import GPT, GPTConfig, load_nanogpt_checkpoint
from attnid.model.layout import model_pairs
from attnid.theory import counts, factor_pairs

TINY = GPTConfig(block_size=32, vocab_size=65, n_layer=2, n_head=2, n_embd=16, dropout=0.0, bias=True)
TOLERANCE = 1e-5  # max |logit change| / max |logit|, float32


def trained_model(bias: bool = True, seed: int = 0, **variant) -> GPT:
    """A tiny GPT (of an attention ``variant``: n_kv_head, rope, ...) after a few AdamW steps, so that every
    bias is off its zero init."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**TINY.model_args(), "bias": bias, **variant}))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(5):
        batch = torch.randint(0, TINY.vocab_size, (4, TINY.block_size + 1), generator=generator)
        _, loss = model(batch[:, :-1].contiguous(), batch[:, 1:].contiguous())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return model


def save_nanogpt(model: GPT, path, compiled: bool = True) -> None:
    """nanoGPT's train.py checkpoint: model_args, model (with torch.compile's prefix), optimizer, config."""
    prefix = "_orig_mod." if compiled else ""
    torch.save(
        {
            "model": {prefix + k: v for k, v in model.state_dict().items()},
            "optimizer": {},
            "model_args": model.config.model_args(),
            "iter_num": 5,
            "best_val_loss": torch.tensor(4.1),
            "config": {"dataset": "shakespeare_char", "compile": compiled},
        },
        path,
    )


def probe_ids() -> torch.Tensor:
    return torch.randint(
        0, TINY.vocab_size, (3, TINY.block_size), generator=torch.Generator().manual_seed(11)
    )


@torch.no_grad()
def relative_logit_change(edited: GPT, original: GPT) -> float:
    before, _ = original(probe_ids(), full_logits=True)
    after, _ = edited(probe_ids(), full_logits=True)
    return float((after - before).abs().max() / before.abs().max())


def run(*argv) -> int:
    return main([str(a) for a in argv])


def test_prune_biases_is_exact_and_counts_the_redundant_biases(tmp_path, shakespeare_path):
    model = trained_model()
    save_nanogpt(model, tmp_path / "ckpt.pt")
    report_path = tmp_path / "prune.json"
    assert (
        run(
            "prune-biases",
            tmp_path / "ckpt.pt",
            "--out",
            tmp_path / "pruned.pt",
            "--text",
            shakespeare_path,
            "--json",
            report_path,
        )
        == 0
    )

    pruned = load_nanogpt_checkpoint(tmp_path / "pruned.pt")
    assert relative_logit_change(pruned, model) <= TOLERANCE
    n_embd = TINY.n_embd
    for edited, original in zip(pruned.transformer.h, model.transformer.h):
        bias, old_bias = edited.attn.c_attn.bias, original.attn.c_attn.bias
        assert old_bias[n_embd:].abs().min() > 0  # training moved every key and value bias
        assert torch.equal(bias[n_embd:], torch.zeros(2 * n_embd))  # key and value biases gone
        assert torch.equal(bias[:n_embd], old_bias[:n_embd])  # query biases are identified: kept
        folded = original.attn.c_proj.bias + original.attn.c_proj.weight @ old_bias[2 * n_embd :]
        torch.testing.assert_close(edited.attn.c_proj.bias, folded, rtol=1e-6, atol=1e-7)

    report = json.loads(report_path.read_text())
    shape = counts.layer_shape(n_embd, TINY.n_head, bias=True)
    assert report["redundant_params"] == TINY.n_layer * 2 * n_embd  # G D key + G C value biases per layer
    assert report["attention_params"] == TINY.n_layer * counts.attention_params_per_layer(shape)
    assert report["redundant_share"] == pytest.approx(report["redundant_params"] / report["attention_params"])
    assert (
        report["nonzero_key_biases_zeroed"] == report["nonzero_value_biases_folded"] == TINY.n_layer * n_embd
    )
    assert report["max_rel_logit_change"] <= TOLERANCE and abs(report["loss_change"]) < 1e-5
    assert str(shakespeare_path) in report["tokens"]

    # the same format: the prefix of the input's keys, its other entries, and a record of the edit
    written = torch.load(tmp_path / "pruned.pt", weights_only=True)
    assert all(key.startswith("_orig_mod.") for key in written["model"])
    assert written["iter_num"] == 5 and written["config"]["dataset"] == "shakespeare_char"
    assert written["attnid_edits"][0]["command"] == "prune-biases"


@torch.no_grad()
def pair_imbalances(model: GPT, circuit: str) -> list[torch.Tensor]:
    return [factor_pairs.imbalance(*pair) for pair in model_pairs(model, circuit)]


def test_balance_reaches_mu_zero_with_the_same_function(tmp_path, capsys):
    model = trained_model(seed=1)
    save_nanogpt(model, tmp_path / "ckpt.pt", compiled=False)
    assert (
        run("balance", tmp_path / "ckpt.pt", "--out", tmp_path / "balanced.pt", "--json", tmp_path / "b.json")
        == 0
    )
    assert "mu_qk" in capsys.readouterr().out

    balanced = load_nanogpt_checkpoint(tmp_path / "balanced.pt")
    assert relative_logit_change(balanced, model) <= TOLERANCE
    before, after = inspect_model(model)["total"], inspect_model(balanced)["total"]
    assert min(before["mu_qk"], before["mu_ov"]) > 1e-3  # training left the pairs unbalanced
    assert max(abs(after["mu_qk"]), abs(after["mu_ov"])) < 1e-6
    for circuit in ("qk", "ov"):
        for imbalance, (pair_a, _) in zip(pair_imbalances(balanced, circuit), model_pairs(balanced, circuit)):
            assert float(imbalance.abs().max()) < 1e-5 * float(factor_pairs.gram(pair_a).abs().max())

    report = json.loads((tmp_path / "b.json").read_text())
    assert report["mu_qk_before"] == pytest.approx(before["mu_qk"]) and report["mu_qk_after"] < 1e-6
    assert report["attn_norm_after"] < report["attn_norm_before"]
    assert report["skipped_pairs"] == 0 and report["max_rel_logit_change"] <= TOLERANCE


def attention_move(edited: dict, original: dict) -> float:
    """Relative Frobenius change of a state dict's attention tensors (``attn.c_attn.*``, ``c_proj.*``)."""
    keys = [k for k in original if ".attn.c_attn." in k or ".attn.c_proj." in k]
    moved = sum(float((edited[k].double() - original[k].double()).square().sum()) for k in keys)
    return (moved / sum(float(original[k].double().square().sum()) for k in keys)) ** 0.5


@pytest.mark.parametrize("variant", [{}, {"n_kv_head": 1}, {"rope": True}], ids=["mha", "mqa", "rope"])
def test_balancing_a_balanced_checkpoint_changes_nothing(tmp_path, variant):
    """docs/design.md §4, §9: balance takes the nearest balanced point, so a second balance moves the
    attention weights by float32 round-off only, and two balanced copies of one model compare entry by
    entry."""
    save_nanogpt(trained_model(seed=3, **variant), tmp_path / "ckpt.pt", compiled=False)
    assert run("balance", tmp_path / "ckpt.pt", "--out", tmp_path / "once.pt") == 0
    assert run("balance", tmp_path / "once.pt", "--out", tmp_path / "twice.pt") == 0
    original, once, twice = (
        torch.load(tmp_path / name, weights_only=True)["model"] for name in ("ckpt.pt", "once.pt", "twice.pt")
    )
    assert attention_move(once, original) > 1e-2  # the first balance moved the weights
    assert attention_move(twice, once) < 1e-6


def test_prune_then_balance_keeps_the_function(tmp_path):
    model = trained_model(seed=2)
    save_nanogpt(model, tmp_path / "ckpt.pt")
    assert run("prune-biases", tmp_path / "ckpt.pt", "--out", tmp_path / "pruned.pt") == 0
    assert run("balance", tmp_path / "pruned.pt", "--out", tmp_path / "both.pt") == 0
    both = load_nanogpt_checkpoint(tmp_path / "both.pt")
    assert relative_logit_change(both, model) <= TOLERANCE
    assert torch.equal(both.transformer.h[0].attn.c_attn.bias[TINY.n_embd :], torch.zeros(2 * TINY.n_embd))
    written = torch.load(tmp_path / "both.pt", weights_only=True)
    assert len(written["attnid_edits"]) == 2

    # nanoGPT's own forward (explicit matmuls on the raw state dict, as nanoGPT's sample.py loads it)
    raw = {k.removeprefix("_orig_mod."): v for k, v in written["model"].items()}
    with torch.no_grad():
        expected, _ = model(probe_ids(), full_logits=True)
    independent = reference_logits(raw, written["model_args"], probe_ids())
    assert float((independent - expected).abs().max() / expected.abs().max()) <= TOLERANCE


def test_prune_without_biases_writes_nothing_and_says_so(tmp_path, capsys):
    model = trained_model(bias=False)
    save_nanogpt(model, tmp_path / "ckpt.pt")
    before = (tmp_path / "ckpt.pt").read_bytes()
    argv = ("prune-biases", tmp_path / "ckpt.pt", "--out", tmp_path / "out.pt", "--json", tmp_path / "r.json")
    assert run(*argv) == 0
    out, err = capsys.readouterr()
    assert out == f"{tmp_path / 'ckpt.pt'}: nothing to prune: no attention biases; no copy written\n"
    assert err == "" and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]
    assert (tmp_path / "ckpt.pt").read_bytes() == before


def test_balance_to_the_runs_initial_imbalance(prepared_data_dir, tmp_path):
    """An attnid run keeps I_0 in its checkpoint: --target initial restores it, and the held-out batch
    is val.bin."""
    run_dir = tmp_path / "run"
    assert (
        run(
            "train",
            "--data",
            prepared_data_dir,
            "--out",
            run_dir,
            "--case",
            "adamw",
            "--max-iters",
            "6",
            "--n-layer",
            "2",
            "--n-head",
            "2",
            "--n-embd",
            "16",
            "--block-size",
            "16",
            "--batch-size",
            "4",
            "--bias",
            "--eval-iters",
            "1",
            "--log-every",
            "3",
            "--eval-every",
            "6",
            "--progress-every",
            "1000",
        )
        == 0
    )
    trained = load_nanogpt_checkpoint(run_dir / "ckpt.pt")  # our own checkpoints load weights-only
    assert run("inspect", run_dir / "ckpt.pt") == 0
    assert (
        run(
            "balance",
            run_dir / "ckpt.pt",
            "--out",
            tmp_path / "i0.pt",
            "--target",
            "initial",
            "--json",
            tmp_path / "r.json",
        )
        == 0
    )
    restored = load_nanogpt_checkpoint(tmp_path / "i0.pt")
    assert relative_logit_change_on(restored, trained) <= TOLERANCE
    initial = load_weights_only(run_dir / "ckpt.pt")["attnid"]["tracker"]["initial_imbalance"]
    for circuit in ("qk", "ov"):
        now = torch.cat(pair_imbalances(restored, circuit))
        drifted = torch.cat(pair_imbalances(trained, circuit))
        assert float((drifted - initial[circuit]).abs().max()) > 1e-6  # AdamW moved I away from I_0 ...
        torch.testing.assert_close(now, initial[circuit], rtol=0, atol=1e-5)  # ... and balance put it back
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["tokens"].endswith("val.bin") and report["target"] == "initial"


def relative_logit_change_on(edited: GPT, original: GPT) -> float:
    ids = torch.randint(
        0,
        original.config.vocab_size,
        (3, original.config.block_size),
        generator=torch.Generator().manual_seed(5),
    )
    with torch.no_grad():
        before, after = original(ids, full_logits=True)[0], edited(ids, full_logits=True)[0]
    return float((after - before).abs().max() / before.abs().max())


def test_initial_target_without_i0_and_in_place_output_are_one_line_errors(tmp_path, capsys):
    save_nanogpt(trained_model(), tmp_path / "ckpt.pt")
    assert run("balance", tmp_path / "ckpt.pt", "--out", tmp_path / "x.pt", "--target", "initial") == 2
    err = capsys.readouterr().err
    assert "I_0" in err and "--target balanced" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.pt").exists()
    assert run("prune-biases", tmp_path / "ckpt.pt", "--out", tmp_path / "ckpt.pt") == 2
    assert "somewhere else" in capsys.readouterr().err


# --------------------------------------------------------------------------------------
# checkpoints that carry code are refused, and their code never runs
# --------------------------------------------------------------------------------------


class RunsShell:
    """Unpickling this calls ``os.system``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


class RunsPython:
    """Unpickling this calls ``exec``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.exec, (f"open({self.marker!r}, 'w').close()",)


def code_carrying_checkpoint(path, payload_class, marker, as_torch_zip: bool) -> None:
    """A nanoGPT-shaped checkpoint with one object whose unpickling runs code that creates ``marker``."""
    model = trained_model()
    checkpoint = {
        "model": model.state_dict(),
        "model_args": model.config.model_args(),
        "config": payload_class(marker),
    }
    if as_torch_zip:
        torch.save(checkpoint, path)
    else:
        path.write_bytes(pickle.dumps(checkpoint))


@pytest.mark.parametrize("payload_class", [RunsShell, RunsPython])
@pytest.mark.parametrize("as_torch_zip", [True, False])
def test_code_carrying_checkpoints_are_refused_before_the_code_runs(
    tmp_path, capsys, payload_class, as_torch_zip
):
    # the payload is live: plain unpickling does run it
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(payload_class(control)))
    assert control.exists()

    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    code_carrying_checkpoint(path, payload_class, marker, as_torch_zip)
    for command in (
        ["inspect", path],
        ["prune-biases", path, "--out", tmp_path / "p.pt"],
        ["balance", path, "--out", tmp_path / "b.pt"],
    ):
        assert run(*command) == 2
        err = capsys.readouterr().err
        assert "refused" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(UserError, match="refused"):
        load_nanogpt_checkpoint(path)
    assert not marker.exists()
    assert not (tmp_path / "p.pt").exists() and not (tmp_path / "b.pt").exists()


@pytest.mark.parametrize(
    "variant, command",
    [({"n_kv_head": 1}, ["prune-biases"]), ({"rope": True}, ["balance", "--target", "initial"])],
)
def test_variants_outside_the_edits_are_one_line_errors(tmp_path, capsys, variant, command):
    """GQA layouts are not (3E, E) for prune-biases; I_0 targets are stored for plain multi-head pairs
    only."""
    save_nanogpt(trained_model(**variant), tmp_path / "ckpt.pt", compiled=False)
    assert run(*command[:1], tmp_path / "ckpt.pt", "--out", tmp_path / "out.pt", *command[1:]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out.pt").exists()


def test_a_layer_without_its_output_projection_is_a_one_line_error(tmp_path, capsys):
    """nanoGPT checkpoints are read with shapes checked but keys optional: a layer lacking
    ``attn.c_proj.weight`` is refused in one line by the command, nothing written, and by
    ``Checkpoint.attention_layer`` itself (a UserError, not a layer holding None)."""
    model = trained_model()
    save_nanogpt(model, tmp_path / "ckpt.pt", compiled=False)
    checkpoint = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    last = model.config.n_layer - 1
    del checkpoint["model"][f"transformer.h.{last}.attn.c_proj.weight"]
    torch.save(checkpoint, tmp_path / "ckpt.pt")
    assert run("prune-biases", tmp_path / "ckpt.pt", "--out", tmp_path / "out.pt") == 2
    err = capsys.readouterr().err
    assert "attn.c_proj.weight" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out.pt").exists()
    with pytest.raises(UserError, match=f"h.{last}.attn.c_proj.weight"):
        load_checkpoint(tmp_path / "ckpt.pt").attention_layer(last)


@pytest.mark.parametrize(
    "variant",
    [{"n_kv_head": 1}, {"rope": True}, {"rope": True, "n_kv_head": 1}, {"n_kv_head": 1, "head_dim": 6}],
)
def test_balance_moves_gqa_and_rope_checkpoints_on_their_own_orbits(tmp_path, variant):
    """μ = 0 on the architecture's own orbit (docs/design.md §8), the function unchanged: a full GL_D move
    of a RoPE pair would change it, so the logit check tests the restriction."""
    model = trained_model(seed=2, **variant)
    save_nanogpt(model, tmp_path / "ckpt.pt")
    assert (
        run("balance", tmp_path / "ckpt.pt", "--out", tmp_path / "balanced.pt", "--json", tmp_path / "b.json")
        == 0
    )
    balanced = load_nanogpt_checkpoint(tmp_path / "balanced.pt")
    assert relative_logit_change(balanced, model) <= TOLERANCE
    before, after = inspect_model(model)["total"], inspect_model(balanced)["total"]
    assert min(before["mu_qk"], before["mu_ov"]) > 1e-3  # training left the pairs unbalanced
    assert max(abs(after["mu_qk"]), abs(after["mu_ov"])) < 1e-6
    report = json.loads((tmp_path / "b.json").read_text())
    assert report["orbit"] == "own" and report["skipped_pairs"] == 0
    assert report["mu_qk_before"] == pytest.approx(before["mu_qk"]) and report["mu_ov_after"] < 1e-6
    assert report["attn_norm_after"] < report["attn_norm_before"]
    assert report["max_rel_logit_change"] <= TOLERANCE
