"""A checkpoint's own model run with simulated quantization, and the statistics its moves are chosen by
(docs/design.md §16).

The model is the format's own implementation (nanoGPT: :class:`attnid.model.gpt.GPT`; Hugging Face:
``transformers``' model of the folder's ``config.json``), built from the checkpoint's tensors in memory.
Quantization is simulated on it by hooks, one setting at a time (:class:`QuantSetting`):

- weights (``W4``, ``W8``): every linear layer of the blocks (attention and MLP; not the embeddings or
  ``lm_head``) rounded per output channel, or per group of input columns;
- activations (``A4``, ``A8``): the input of every linear layer of the blocks, per token (or per group),
  or only at the sites named (``A4:qkv+up``): ``qkv`` (the query/key/value input, after the attention's
  norm), ``o`` (the output projection's input), ``up`` (the MLP's input: gate and up, or ``c_fc``), ``down``
  (the down projection's input);
- the KV cache (``KV4``, ``KV3``; ``V4``, ``K4`` one side only): each head's key and value vectors, one
  scale per token and head. Keys are rounded before RoPE (as KVQuant does): the cache's keys are then the
  rotated rounded keys.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from attnid.common import progress
from attnid.common.errors import UserError
from attnid.common.files import require
from attnid.edits.checkpoint_types import HF_LLAMA, NANOGPT, Checkpoint
from attnid.measure.quantization import activation_shape, kl_per_token, round_to_nearest
from attnid.model.gpt import COMPILED_PREFIX, model_from_checkpoint

SITES = ("qkv", "o", "up", "down")
# module name suffixes of each site, per family (nanoGPT and GPT-2 share names)
SITE_MODULES: dict[str, dict[str, tuple[str, ...]]] = {
    "llama": {
        "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        "o": ("self_attn.o_proj",),
        "up": ("mlp.gate_proj", "mlp.up_proj"),
        "down": ("mlp.down_proj",),
    },
    "gpt": {"qkv": ("attn.c_attn",), "o": ("attn.c_proj",), "up": ("mlp.c_fc",), "down": ("mlp.c_proj",)},
}
SETTING = re.compile(r"^(?P<kind>W|A|KV|K|V)(?P<bits>\d+)(?::(?P<sites>[a-z+]+))?$")

LAYER_INDEX = re.compile(r"\.(?:h|layers)\.(\d+)\.")


@dataclass(frozen=True)
class QuantSetting:
    """One simulated quantization: ``kind`` W (weights), A (linear inputs), KV, K or V (the cache)."""

    name: str
    kind: str
    bits: int
    sites: tuple[str, ...] = SITES

    @property
    def cache(self) -> tuple[str, ...]:
        return {"KV": ("k", "v"), "K": ("k",), "V": ("v",)}.get(self.kind, ())


def parse_setting(text: str) -> QuantSetting:
    """``W4``, ``A8``, ``A4:qkv+up``, ``KV3``, ``V4``: one setting; a UserError line for anything else."""
    match = SETTING.match(text.strip())
    if match is None:
        raise UserError(
            f"quantization setting {text!r}: expected W<bits>, A<bits>[:sites], KV<bits>, K<bits> or "
            f"V<bits> (sites: {'+'.join(SITES)})"
        )
    bits = int(match["bits"])
    if not 2 <= bits <= 16:
        raise UserError(f"quantization setting {text!r}: bits must be from 2 to 16")
    sites = tuple(match["sites"].split("+")) if match["sites"] else SITES
    unknown = [site for site in sites if site not in SITES]
    if unknown or (match["sites"] and match["kind"] != "A"):
        raise UserError(
            f"quantization setting {text!r}: sites are for A<bits> only, among {', '.join(SITES)}"
        )
    return QuantSetting(text.strip(), match["kind"], bits, sites)


@dataclass
class RunnableModel:
    """A checkpoint's model in memory: ``logits(ids)``, and its linear layers by site and layer."""

    module: torch.nn.Module
    family: str  # "llama" or "gpt"
    kind: str  # the checkpoint's format
    n_kv_head: int
    head_dim: int
    q_width: int
    linears: dict[tuple[str, int], list[torch.nn.Module]] = field(default_factory=dict)

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        if self.kind == NANOGPT:
            return self.module(ids, full_logits=True)[0]
        return self.module(input_ids=ids).logits


def _no_init(transformers):
    """transformers' context that skips the random initialisation of a model's weights (where it has one)."""
    for owner in ("initialization", "modeling_utils"):
        context = getattr(getattr(transformers, owner, None), "no_init_weights", None)
        if context is not None:
            return context()
    return contextlib.nullcontext()


def _hf_module(
    checkpoint: Checkpoint, tensors: dict[str, torch.Tensor], dtype: torch.dtype
) -> torch.nn.Module:
    """``transformers``' model of the folder's config with ``tensors`` as its weights: built without the
    random initialisation of weights about to be replaced, the tensors assigned (shared, not copied, where
    already in ``dtype``)."""
    transformers = require("transformers", "running a Hugging Face model")
    transformers.logging.set_verbosity_error()
    payload = {k: v for k, v in checkpoint.payload.items() if k not in ("dtype", "torch_dtype")}
    try:
        config = transformers.AutoConfig.for_model(**payload)
        config._attn_implementation = "eager"
        with _no_init(transformers):
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    except (ValueError, KeyError, TypeError) as err:
        raise UserError(f"transformers cannot build the model of {checkpoint.path}: {err}") from None
    state = {key: tensor.to(dtype) for key, tensor in tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    tied_head = bool(config.tie_word_embeddings) and any(key.endswith("lm_head.weight") for key in missing)
    left = [key for key in missing if not (tied_head and key.endswith("lm_head.weight"))]
    if left or unexpected:
        raise UserError(
            f"{checkpoint.path}: weights and config disagree (missing {left[:3]}, extra {unexpected[:3]})"
        )
    if tied_head:
        model.tie_weights()
    return model.eval()


def runnable_model(
    checkpoint: Checkpoint, dtype: torch.dtype, tensors: dict[str, torch.Tensor] | None = None
) -> RunnableModel:
    """The checkpoint's model (with ``tensors`` in place of its own, when given), in ``dtype``."""
    tensors = checkpoint.tensors if tensors is None else tensors
    module: torch.nn.Module
    if checkpoint.kind == NANOGPT:
        module = model_from_checkpoint(dict(checkpoint.payload, model=tensors)).to(dtype).eval()
    else:
        module = _hf_module(checkpoint, tensors, dtype)
    family = "llama" if checkpoint.kind == HF_LLAMA else "gpt"
    shape = checkpoint.attention
    model = RunnableModel(
        module, family, checkpoint.kind, shape.n_kv_head, shape.head_dim, shape.n_head * shape.head_dim
    )
    for name, sub in module.named_modules():
        name = name.removeprefix(COMPILED_PREFIX)
        layer = LAYER_INDEX.search("." + name + ".")
        for site, suffixes in SITE_MODULES[family].items():
            if layer is not None and name.endswith(suffixes):
                model.linears.setdefault((site, int(layer[1])), []).append(sub)
    return model


def _weight_matrix(module: torch.nn.Module) -> torch.Tensor:
    """The module's weight as out x in (GPT-2's Conv1D stores in x out)."""
    weight = module.get_parameter("weight")
    return weight.t() if type(module).__name__ == "Conv1D" else weight


@contextmanager
def quantized_weights(model: RunnableModel, bits: int, group: int) -> Iterator[None]:
    """Every block linear layer's weight rounded (per output channel, or per ``group`` input columns)."""
    saved = {}
    with torch.no_grad():
        for modules in model.linears.values():
            for module in modules:
                saved[module] = module.get_parameter("weight").detach().clone()
                matrix = _weight_matrix(module)
                matrix.copy_(round_to_nearest(matrix, bits, _group_for(matrix.shape[-1], group)))
    try:
        yield
    finally:
        with torch.no_grad():
            for module, weight in saved.items():
                module.get_parameter("weight").copy_(weight)


def _group_for(width: int, group: int) -> int:
    return group if group and width % group == 0 else 0


def _cache_hook(model: RunnableModel, sides: tuple[str, ...], bits: int) -> Callable:
    d = model.head_dim

    def per_head(x: torch.Tensor) -> torch.Tensor:
        return round_to_nearest(x, bits, d)

    def hook(module, inputs, output):
        if model.family == "llama":
            return per_head(output)
        q, k, v = output.split([model.q_width, model.n_kv_head * d, model.n_kv_head * d], dim=-1)
        k = per_head(k) if "k" in sides else k
        v = per_head(v) if "v" in sides else v
        return torch.cat([q, k, v], dim=-1)

    return hook


def _cache_modules(model: RunnableModel, sides: tuple[str, ...]) -> list[torch.nn.Module]:
    if model.family == "gpt":
        return [modules[0] for (site, _), modules in model.linears.items() if site == "qkv"]
    wanted = {"k": "k_proj", "v": "v_proj"}
    return [
        module
        for (site, _), modules in model.linears.items()
        if site == "qkv"
        for module in modules
        if any(wanted[side] in _name_of(model, module) for side in sides)
    ]


def _name_of(model: RunnableModel, module: torch.nn.Module) -> str:
    for name, sub in model.module.named_modules():
        if sub is module:
            return name
    return ""


@contextmanager
def quantized(model: RunnableModel, setting: QuantSetting | None, group: int = 0) -> Iterator[None]:
    """The model with one setting's rounding in place (None: the float model)."""
    if setting is None:
        yield
        return
    if setting.kind == "W":
        with quantized_weights(model, setting.bits, group):
            yield
        return
    handles = []
    if setting.kind == "A":
        for (site, _), modules in model.linears.items():
            if site in setting.sites:
                for module in modules:
                    handles.append(
                        module.register_forward_pre_hook(
                            lambda m, args: (
                                round_to_nearest(args[0], setting.bits, _group_for(args[0].shape[-1], group)),
                            )
                        )
                    )
    else:
        hook = _cache_hook(model, setting.cache, setting.bits)
        handles = [m.register_forward_hook(hook) for m in _cache_modules(model, setting.cache)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


BATCH = 2  # windows per forward: a (2, 256, 49152) float32 logits tensor is 100 MB


@torch.no_grad()
def next_token_log_probs(model: RunnableModel, windows: torch.Tensor, batch: int = BATCH) -> torch.Tensor:
    """Next-token log-probabilities ``(S, T, V)`` of the windows' inputs ``windows[:, :-1]`` (float32, float64
    for a float64 model)."""
    parts = []
    for start in range(0, windows.shape[0], batch):
        logits = model.logits(windows[start : start + batch, :-1])
        parts.append(F.log_softmax(logits if logits.dtype == torch.float64 else logits.float(), dim=-1))
    return torch.cat(parts)


def nll(logp: torch.Tensor, windows: torch.Tensor) -> float:
    """Mean next-token cross-entropy of ``logp`` on the windows' targets."""
    return float(-logp.gather(-1, windows[:, 1:, None]).mean())


@torch.no_grad()
def kl_and_nll(
    model: RunnableModel, windows: torch.Tensor, reference: torch.Tensor, batch: int = BATCH
) -> tuple[torch.Tensor, float]:
    """The KL per position of the model's next-token distribution from ``reference`` (log-probabilities of
    the same windows), and its mean cross-entropy: batch by batch, never the whole ``(S, T, V)`` twice."""
    kls, losses = [], []
    for start in range(0, windows.shape[0], batch):
        part = windows[start : start + batch]
        logp = next_token_log_probs(model, part, batch)
        kls.append(kl_per_token(reference[start : start + batch], logp))
        losses.append(-logp.gather(-1, part[:, 1:, None]).squeeze(-1))
    return torch.cat(kls), float(torch.cat(losses).mean())


@torch.no_grad()
def evaluate_settings(
    model: RunnableModel, windows: torch.Tensor, settings: list[QuantSetting], group: int = 0
) -> tuple[list[dict], list[dict]]:
    """One row per setting (the float model first): mean and max KL(float || quantized) per token, the
    loss and perplexity; and the float model's activation rows (:func:`activation_rows`), recorded on the
    same forward."""
    progress.stage("the float model")
    with recorded_inputs(model) as seen:
        reference = next_token_log_probs(model, windows)
    activations = activation_rows(seen)
    del seen
    loss = nll(reference, windows)
    rows = [
        {"setting": "float", "kl": 0.0, "kl_max": 0.0, "loss": loss, "ppl": float(torch.tensor(loss).exp())}
    ]
    for index, setting in enumerate(settings):
        progress.stage(f"evaluating {setting.name} ({index + 1} of {len(settings)})")
        with quantized(model, setting, group):
            kl, loss = kl_and_nll(model, windows, reference)
        rows.append(
            {
                "setting": setting.name,
                "kl": float(kl.mean()),
                "kl_max": float(kl.max()),
                "loss": loss,
                "ppl": float(torch.tensor(loss).exp()),
            }
        )
    return rows, activations


@contextmanager
def recorded_inputs(model: RunnableModel, sites: tuple[str, ...] = SITES) -> Iterator[dict]:
    """While active, the inputs of each site's first linear layer, by ``(site, layer)``: lists of
    ``(tokens, width)`` float32 tensors."""
    seen: dict[tuple[str, int], list[torch.Tensor]] = {}
    handles = []
    for key, modules in model.linears.items():
        if key[0] in sites:

            def hook(module, args, key=key):
                seen.setdefault(key, []).append(args[0].detach().reshape(-1, args[0].shape[-1]).float())

            handles.append(modules[0].register_forward_pre_hook(hook))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def activation_rows(seen: dict[tuple[str, int], list[torch.Tensor]]) -> list[dict]:
    """Per site and layer: kurtosis and max/rms of the linear-layer inputs :func:`recorded_inputs` saw."""
    rows = []
    for (site, layer), parts in sorted(seen.items(), key=lambda item: (item[0][1], SITES.index(item[0][0]))):
        rows.append({"site": site, "layer": layer, **activation_shape(torch.cat(parts))})
    return rows


@dataclass
class CalibrationStatistics:
    """What the data-driven moves are chosen by, per layer: the pre-RoPE second moments ``(G, D, D)`` of
    each key/value group's keys and values and of its query heads (summed over the group's heads), and
    each channel's largest ``|x|`` at the inputs of the ``qkv``, ``up`` and ``down`` sites."""

    queries: dict[int, torch.Tensor] = field(default_factory=dict)
    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    input_max: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)


def _accumulate(store: dict[int, torch.Tensor], layer: int, x: torch.Tensor, groups: int, d: int) -> None:
    """Add ``sum_t x_t x_t^T`` per group; ``x`` ``(..., groups * heads * d)``, heads summed within a group."""
    per = x.detach().reshape(-1, groups, x.shape[-1] // (groups * d), d).double()
    moment = torch.einsum("tghi,tghj->gij", per, per)
    store[layer] = store[layer] + moment if layer in store else moment


@torch.no_grad()
def calibration_statistics(model: RunnableModel, windows: torch.Tensor) -> CalibrationStatistics:
    """:class:`CalibrationStatistics` of the float model on ``windows`` (calibration text)."""
    found = CalibrationStatistics()
    g, d = model.n_kv_head, model.head_dim
    handles = []
    for (site, layer), modules in model.linears.items():
        if site in ("qkv", "up", "down"):

            def amax(module, args, key=(site, layer)):
                top = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(dim=0).double()
                found.input_max[key] = (
                    torch.maximum(found.input_max[key], top) if key in found.input_max else top
                )

            handles.append(modules[0].register_forward_pre_hook(amax))
        if site != "qkv":
            continue
        if model.family == "gpt":

            def split(module, args, output, layer=layer):
                q, k, v = output.split([model.q_width, g * d, g * d], dim=-1)
                for store, x in ((found.queries, q), (found.keys, k), (found.values, v)):
                    _accumulate(store, layer, x, g, d)

            handles.append(modules[0].register_forward_hook(split))
            continue
        for module, store in zip(modules, (found.queries, found.keys, found.values), strict=True):

            def one(module, args, output, store=store, layer=layer):
                _accumulate(store, layer, output, g, d)

            handles.append(module.register_forward_hook(one))
    try:
        next_token_log_probs(model, windows)
    finally:
        for handle in handles:
            handle.remove()
    return found
