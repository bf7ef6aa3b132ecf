"""Memory a GPT needs for a training step or a forward pass, estimated before anything is allocated
(docs/design.md §6.2).

The estimates are lower bounds: they count the tensors that must exist at the same time
(autograd's saved activations, the weights, their gradients, the optimizer state, the
logits) and leave out what depends on kernels and allocators (workspace, fragmentation,
the T x T attention scores of a non-fused attention kernel). A run they refuse cannot fit;
a run they pass may still run out of memory, which the command line then reports in one
line.
"""

from __future__ import annotations

from attnid.model.gpt import GPTConfig, parameter_count

# bytes of one activation value and of one weight, by training precision (attnid.training.precision):
# autocast keeps float32 weights and optimizer state but computes most activations in 16 bits
VALUE_BYTES = {"float32": 4, "float64": 8, "bf16": 2, "fp16": 2}
WEIGHT_BYTES = {"float32": 4, "float64": 8, "bf16": 4, "fp16": 4}
LOGIT_BYTES = 4  # the loss is computed from float32 logits


def saved_values_per_token(config: GPTConfig) -> int:
    """Activation values autograd keeps per token for the backward pass (docs/design.md §6.2): per block
    the two LayerNorms' inputs and outputs (4E), q, k, v (H D + 2 G D), the attention output (H D), the
    attention's residual output (E), the MLP's hidden layer before and after GELU (8E); the embedding and
    the final LayerNorm (3E); the logits are counted by :func:`training_footprint`."""
    E, H, G, D = config.n_embd, config.n_head, config.kv_heads, config.per_head_dim
    per_block = 4 * E + (H * D + 2 * G * D) + H * D + E + 8 * E
    return config.n_layer * per_block + 3 * E


def training_footprint(
    config: GPTConfig, batch_size: int, dtype: str, optimizer_states: int
) -> dict[str, int]:
    """``{part: bytes}`` of one training step of a ``(batch_size, block_size)`` batch in ``dtype``, with
    ``optimizer_states`` tensors of optimizer state per parameter (AdamW 2, momentum 1, SGD 0)."""
    params = parameter_count(config)
    tokens = batch_size * config.block_size
    weight = WEIGHT_BYTES[dtype]
    return {
        "activations": tokens * saved_values_per_token(config) * VALUE_BYTES[dtype],
        "logits and their gradient": 2 * tokens * config.vocab_size * LOGIT_BYTES,
        "weights and gradients": 2 * params * weight,
        "optimizer state": optimizer_states * params * weight,
    }


def forward_footprint(config: GPTConfig, sequences: int, length: int) -> dict[str, int]:
    """``{part: bytes}`` of a float32 forward pass without gradients on ``(sequences, length)`` tokens:
    the weights, the widest tensors of one block at a time (the MLP's 4E hidden layer before and after
    GELU, and the residual stream) and the logits."""
    tokens = sequences * length
    return {
        "weights": parameter_count(config) * 4,
        "activations": tokens * (8 + 2) * config.n_embd * 4,
        "logits": tokens * config.vocab_size * LOGIT_BYTES,
    }
