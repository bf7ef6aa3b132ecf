"""The tiny model and the attention variants that the model and orbit tests share."""

TINY = dict(block_size=16, vocab_size=23, n_layer=2, n_head=4, n_embd=32, dropout=0.0)
# name -> GPTConfig fields over TINY: stock MHA, GQA/MQA, RoPE and both, head widths other than E/H
VARIANTS = {
    "mha": dict(),
    "gqa G=2": dict(n_kv_head=2),
    "mqa G=1": dict(n_kv_head=1),
    "rope": dict(rope=True),
    "rope+gqa G=2": dict(rope=True, n_kv_head=2),
    "rope+mqa D=6": dict(rope=True, n_kv_head=1, head_dim=6),
    "gqa D=12": dict(n_kv_head=2, head_dim=12),
    "one head D=32": dict(n_head=1, head_dim=32),
}

# the tiny random Hugging Face folders of the checkpoint-edit and quantization tests
TINY_HF = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    initializer_range=0.2,
)
