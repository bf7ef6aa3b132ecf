"""The held-out batch on which checkpoint edits are proven, and the before/after comparison.

Tokens, first source found wins (the report names it):

1. nanoGPT checkpoints without ``--text``: ``val.bin`` of a prepared data folder
   (``attnid prepare``: tiny shakespeare's last 10 %) -- ``--data DIR``, else the
   checkpoint's own folder, the ``data`` folder its ``attnid train`` config names,
   nanoGPT's ``data/<dataset>``, or the pipeline's ``data/tinyshakespeare``.
2. Text: ``--text FILE``, else the last 10 % of tiny shakespeare (the pipeline's
   ``data/tinyshakespeare/input.txt``, or the repository's ``assets/tinyshakespeare.txt``).
   Character models encode it with the ``meta.json`` vocabulary of the folders above;
   Hugging Face folders with their own tokenizer files when they have them (read
   offline). Otherwise each token is the text's byte value modulo the vocabulary
   size: not the model's tokenisation, but a fixed, reproducible input, which is all
   that a test of function preservation needs.
3. No text at all: token ids from a generator seeded with 0.

``nanoGPT``'s ``meta.pkl`` is never read (it is a pickle).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch.nn import functional as F

from attnid.common.errors import UserError
from attnid.common.files import require
from attnid.common.memory import require_memory
from attnid.common.paths import require_regular_file
from attnid.edits.checkpoints import HF_LLAMA, NANOGPT, Checkpoint
from attnid.model.footprint import forward_footprint
from attnid.model.gpt import GPTConfig, config_from_model_args, model_from_checkpoint
from attnid.training import data as data_module


class HeldoutOptions(Protocol):
    """The edit commands' options that choose the held-out batch (``--data``, ``--text``, ``--sequences``,
    ``--length``; parsed by :mod:`attnid.cli.checkpoints`)."""

    data: Path | None
    text: Path | None
    sequences: int
    length: int


PIPELINE_DATA_DIR = Path("data") / "tinyshakespeare"
DEFAULT_TEXTS = (
    PIPELINE_DATA_DIR / "input.txt",
    Path("assets") / "tinyshakespeare.txt",
)  # relative to the repository
VAL_FRACTION = 0.1  # nanoGPT's split: the last 10 % of the text is validation
RANDOM_TOKENS_SEED = 0


def _data_dirs(checkpoint: Checkpoint, data: Path | None) -> list[Path]:
    if data is not None:
        return [data]
    candidates = []
    if checkpoint.kind == NANOGPT:
        candidates.append(checkpoint.path.parent)
        config = checkpoint.payload.get("config")
        config = config if isinstance(config, dict) else {}
        if isinstance(config.get("data"), str):
            candidates.append(Path(config["data"]))  # attnid train --data
        if isinstance(config.get("dataset"), str):
            candidates.append(Path("data") / config["dataset"])  # nanoGPT's layout
    candidates.append(PIPELINE_DATA_DIR)
    return candidates


def _encode_text(text: str, checkpoint: Checkpoint, dirs: list[Path]) -> tuple[np.ndarray, str]:
    vocab = checkpoint.vocab_size
    if checkpoint.kind == NANOGPT:
        meta_dir = next((d for d in dirs if (d / data_module.META_NAME).is_file()), None)
        if meta_dir is not None:
            stoi = data_module.load_meta(meta_dir)["stoi"]
            unknown = sorted(set(text) - set(stoi))
            if unknown:
                raise UserError(
                    f"the held-out text has characters outside {meta_dir / data_module.META_NAME}'s "
                    f"vocabulary ({unknown[:5]!r}): pass --text with text of the training alphabet"
                )
            return data_module.encode(text, stoi).astype(
                np.int64
            ), f"text encoded with {meta_dir / 'meta.json'}"
    elif any((checkpoint.path / name).is_file() for name in ("tokenizer.json", "vocab.json")):
        transformers = require("transformers", "reading a Hugging Face tokenizer")
        transformers.logging.set_verbosity_error()  # its warnings about the folder's config are not ours
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(
                str(checkpoint.path), local_files_only=True
            )
            ids = np.asarray(tokenizer(text)["input_ids"], dtype=np.int64)
        except Exception as err:  # noqa: BLE001 - tokenizers raise their own types for a broken file
            first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
            raise UserError(
                f"the tokenizer files of {checkpoint.path} cannot be read ({type(err).__name__}: {first}); "
                f"fix or remove them"
            ) from None
        return ids, "text encoded with the folder's tokenizer"
    raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
    return raw % vocab, f"text bytes modulo the vocabulary size {vocab}"


def _tokens(checkpoint: Checkpoint, args: HeldoutOptions) -> tuple[np.ndarray | None, str]:
    dirs = _data_dirs(checkpoint, args.data)
    if args.text is None and checkpoint.kind == NANOGPT:
        for folder in dirs:
            if folder == args.data or (
                (folder / "val.bin").is_file() and (folder / data_module.META_NAME).is_file()
            ):
                tokens = np.asarray(data_module.load_split(folder, "val"), dtype=np.int64)
                if int(tokens.max()) >= checkpoint.vocab_size:
                    raise UserError(
                        f"{folder / 'val.bin'} has token {int(tokens.max())}, beyond the model's "
                        f"vocabulary of {checkpoint.vocab_size}: pass --data of the model's dataset"
                    )
                return tokens, f"{folder / 'val.bin'}"
    if args.text is not None:
        require_regular_file(args.text, "--text")
    if args.text is not None and not args.text.is_file():
        raise UserError(f"--text {args.text} {'is a directory' if args.text.is_dir() else 'not found'}")
    text_path = args.text if args.text is not None else next((p for p in DEFAULT_TEXTS if p.is_file()), None)
    if text_path is None:
        return None, f"random token ids (seed {RANDOM_TOKENS_SEED}): no held-out text found"
    try:
        text = text_path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{text_path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    if args.text is None:
        text = text[int(len(text) * (1 - VAL_FRACTION)) :]
    tokens, how = _encode_text(text, checkpoint, dirs)
    return tokens, f"{text_path}{'' if args.text is not None else ' (validation part)'}, {how}"


def check_eval_memory(checkpoint: Checkpoint, sequences: int, length: int) -> None:
    """Refuse a held-out batch whose two evaluations cannot fit in the host's memory (docs/design.md §6.2):
    the stored weights, an evaluation model, one forward pass, and the logits before and after."""
    if checkpoint.kind == NANOGPT:
        config = config_from_model_args(checkpoint.payload["model_args"])
    else:
        config = GPTConfig(
            n_layer=checkpoint.n_layer,
            n_head=checkpoint.attention.n_head,
            n_embd=checkpoint.attention.n_embd,
            vocab_size=checkpoint.vocab_size,
            block_size=checkpoint.block_size,
        )
    parts = forward_footprint(config, sequences, length)
    parts["logits"] *= 2  # before and after are compared
    parts["stored weights"] = sum(t.numel() * t.element_size() for t in checkpoint.tensors.values())
    require_memory(
        parts,
        "cpu",
        f"--sequences {sequences} x --length {length} on {checkpoint.path}",
        "lower --sequences or --length",
    )


def heldout_batch(checkpoint: Checkpoint, args: HeldoutOptions) -> tuple[torch.Tensor, str]:
    """``(S, T+1)`` token ids (inputs and next-token targets) from evenly spaced windows, and their source."""
    if args.sequences < 1 or args.length < 1:
        raise UserError("--sequences and --length must be positive")
    length = min(args.length, checkpoint.block_size)
    check_eval_memory(checkpoint, args.sequences, length)
    tokens, source = _tokens(checkpoint, args)
    if tokens is None:
        generator = torch.Generator().manual_seed(RANDOM_TOKENS_SEED)
        return torch.randint(
            0, checkpoint.vocab_size, (args.sequences, length + 1), generator=generator
        ), source
    if len(tokens) < length + 1:
        raise UserError(f"the held-out tokens ({len(tokens)}) are fewer than one sequence of {length + 1}")
    if int(tokens.max()) >= checkpoint.vocab_size or int(tokens.min()) < 0:
        raise UserError(
            f"the held-out tokens ({source}) reach id {int(tokens.max())}, beyond the model's vocabulary of "
            f"{checkpoint.vocab_size}: pass --text or --data that the model's vocabulary covers"
        )
    starts = np.linspace(0, len(tokens) - (length + 1), args.sequences).astype(np.int64)
    windows = tokens[starts[:, None] + np.arange(length + 1)]  # (S, T+1)
    return torch.from_numpy(np.ascontiguousarray(windows)), source


def load_for_eval(checkpoint: Checkpoint) -> Callable[[torch.Tensor], torch.Tensor]:
    """A callable ``ids (B, T) -> logits (B, T, V)`` for the checkpoint as written on disk."""
    if checkpoint.kind == NANOGPT:
        model = model_from_checkpoint(dict(checkpoint.payload, model=checkpoint.tensors)).eval()
        return lambda ids: model(ids, full_logits=True)[0]
    model_class = "AutoModelForCausalLM" if checkpoint.kind == HF_LLAMA else "GPT2LMHeadModel"
    return _hf_model(checkpoint.path, model_class)


def _hf_model(folder: Path, model_class: str):
    """``transformers``' own model for the folder, built in float32 whatever its stored dtype: a bfloat16 or
    float16 weight is exact in float32, so before and after are compared on what is stored, and buffers the
    model computes at load (Gemma's embedding scale) are not rounded to the stored dtype either."""
    transformers = require("transformers", "evaluating a Hugging Face model")
    # lazy: packaging, an optional dependency (the hf extra) read with transformers
    from packaging.version import Version  # in the hf extra (transformers needs it too)

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    # from_pretrained's dtype keyword is torch_dtype before transformers 4.56
    dtype_keyword = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
    # the folder's weights passed the weights-only loader already; nothing is downloaded
    try:
        model = (
            getattr(transformers, model_class)
            .from_pretrained(
                str(folder),
                local_files_only=True,
                attn_implementation="eager",
                **{dtype_keyword: torch.float32},
            )
            .eval()
        )
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as err:  # a folder it cannot load
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"transformers cannot load {folder}: {first}") from None
    return lambda ids: model(input_ids=ids).logits


@torch.no_grad()
def evaluate(
    logits_of: Callable[[torch.Tensor], torch.Tensor], batch: torch.Tensor
) -> tuple[float, torch.Tensor]:
    """Mean next-token cross-entropy and the logits ``(S, T, V)`` on ``batch`` ``(S, T+1)``."""
    inputs, targets = batch[:, :-1], batch[:, 1:]
    logits = logits_of(inputs).float()
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return float(loss), logits


def compare(
    loss_before: float, logits_before: torch.Tensor, loss_after: float, logits_after: torch.Tensor
) -> dict:
    """Loss before/after and the max logit change relative to the largest logit (as ``tau_logits``)."""
    scale = float(logits_before.abs().max())
    change = float((logits_after - logits_before).abs().max())
    return {
        "loss_before": loss_before,
        "loss_after": loss_after,
        "loss_change": loss_after - loss_before,
        "max_rel_logit_change": change / scale if scale > 0 else change,
    }


def _evenly_spaced(tokens: np.ndarray, count: int, length: int, what: str) -> torch.Tensor:
    if len(tokens) < length + 1:
        raise UserError(f"the {what} text has {len(tokens)} tokens, fewer than one window of {length + 1}")
    starts = np.linspace(0, len(tokens) - (length + 1), count).astype(np.int64)
    return torch.from_numpy(np.ascontiguousarray(tokens[starts[:, None] + np.arange(length + 1)]))


def calibration_and_evaluation(
    checkpoint: Checkpoint,
    text: Path | None,
    data: Path | None,
    length: int,
    evaluation_tokens: int,
    calibration_tokens: int,
    random_fallback: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor, str]:
    """Disjoint calibration and evaluation windows ``(S, length + 1)`` and their source (docs/design.md
    §16): from ``text``, its first half and its second half; without it, tiny shakespeare's training part
    (the first 90 %) and its validation part. ``S`` windows cover ``*_tokens`` tokens (at least one).
    Where there is no text and ``random_fallback``: no calibration, and seeded random token ids to
    evaluate on (a probe of the function needs no text)."""
    if text is not None:
        require_regular_file(text, "--text")
        if not text.is_file():
            raise UserError(f"--text {text} {'is a directory' if text.is_dir() else 'not found'}")
    path = text if text is not None else next((p for p in DEFAULT_TEXTS if p.is_file()), None)
    length = min(length, checkpoint.block_size)
    if path is None and random_fallback:
        generator = torch.Generator().manual_seed(RANDOM_TOKENS_SEED)
        count = max(1, -(-evaluation_tokens // length))
        ids = torch.randint(0, checkpoint.vocab_size, (count, length + 1), generator=generator)
        return None, ids, f"random token ids (seed {RANDOM_TOKENS_SEED}): no text found"
    if path is None:
        raise UserError("no text to calibrate and evaluate on: pass --text FILE")
    try:
        content = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    cut = len(content) // 2 if text is not None else int(len(content) * (1 - VAL_FRACTION))
    dirs = _data_dirs(checkpoint, data)
    calibration, how = _encode_text(content[:cut], checkpoint, dirs)
    evaluation, _ = _encode_text(content[cut:], checkpoint, dirs)
    windows = [
        _evenly_spaced(part, max(1, -(-tokens // length)), length, what)
        for part, tokens, what in (
            (calibration, calibration_tokens, "calibration"),
            (evaluation, evaluation_tokens, "evaluation"),
        )
    ]
    halves = "first and second half" if text is not None else "training and validation parts"
    return windows[0], windows[1], f"{path} ({halves}), {how}"
