"""Closed forms of every continuous symmetry of a whole model (docs/theory.md, "The whole model").

The attention-only counts of :mod:`attnid.theory.counts` (claims T1-T5) cover one layer's
attention. A whole language model has more parameter directions that leave its
log-probabilities unchanged; this module counts all of them, class by class, for the
two families the project trains or reads (docs/design.md §12):

* nanoGPT / GPT-2: LayerNorm with or without a bias, GELU MLP, learned positions,
  ``lm_head`` tied to ``wte`` (or untied);
* Llama family: RMSNorm, RoPE, grouped-query attention, gated MLP (SwiGLU, GeGLU),
  untied ``lm_head`` (Gemma ties it);

and the parallel block of Falcon / GPT-J (attention and MLP read one shared norm).

Each class below is a pure function of a :class:`WholeModelShape` returning the dimension
it adds to the null space at a generic point, *after* the classes listed before it: the
tangent spaces of different classes may overlap, and the rows of the census add up to
the dimension of their sum (docs/theory.md derives each class and each overlap).
``attnid census`` (:mod:`attnid.theory.census`) checks the sum against the measured nullity of
the whole-model Jacobian.

Notation (docs/design.md §1): ``E`` width, ``H`` query heads, ``G`` key/value groups, ``D``
head dimension (values too: ``C = D``, as in model.py), ``L`` layers, ``V`` vocabulary,
``T`` learned positions (``block_size``), ``F`` MLP hidden width. ``E' = E - 1`` for
LayerNorm (its output lies in the hyperplane orthogonal to the all-ones vector ``1_E``)
and ``E' = E`` for RMSNorm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from attnid.theory import counts
from attnid.theory.shape import LayerShape, layer_shape

NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu", "geglu")  # swiglu / geglu: act(W_gate x) * (W_up x), then W_down
GATED_MLPS = ("swiglu", "geglu")
POSITIONS = ("learned", "rope", "none")
BLOCKS = ("sequential", "parallel")  # parallel: x + attn(n(x)) + mlp(n(x)), one shared norm
DEFAULT_NORM_EPS = 1e-5  # model.py's LayerNorm
# The census's measurement defaults (attnid.theory.census), here without torch so that `attnid census
# --help` shows it at once: the RoPE base it measures with.
CENSUS_ROPE_BASE = 10.0


@dataclass(frozen=True)
class WholeModelShape:
    """One whole model; build it with :func:`whole_model_shape` (validates and fills defaults)."""

    n_layer: int  # L
    attention: LayerShape  # each layer's: E, H, G, D (= C, the value width), q/k/v and output biases, RoPE
    vocab_size: int  # V
    block_size: int  # T, the learned positions (and the census's sequence length)
    norm: str  # layernorm | rmsnorm
    norm_bias: bool  # LayerNorm bias (RMSNorm has none)
    mlp: str  # gelu | swiglu | geglu
    mlp_hidden: int  # F
    mlp_bias: bool  # biases on the MLP's linear layers
    tied: bool  # lm_head is wte
    positions: str  # learned (wpe) | rope (attention.rope) | none
    block: str  # sequential | parallel
    norm_eps: float  # the norms' epsilon; 0 makes the residual scaling an exact symmetry


def shape_columns(shape: WholeModelShape) -> dict:
    """The shape as the columns of a table row (census.csv, whole_model.csv): the attention's sizes in its
    place, its biases (``qkv_bias``, ``out_bias``) after ``norm_bias``."""
    attention, own = shape.attention, vars(shape)
    row = {"n_layer": shape.n_layer, "n_embd": attention.n_embd, "n_head": attention.n_head}
    row |= {"n_kv_head": attention.n_kv_head, "head_dim": attention.head_dim}
    row |= {key: own[key] for key in ("vocab_size", "block_size", "norm", "norm_bias")}
    row |= {"qkv_bias": attention.bias, "out_bias": attention.out_bias}
    tail = ("mlp", "mlp_hidden", "mlp_bias", "tied", "positions", "block", "norm_eps")
    return row | {key: own[key] for key in tail}


def whole_model_shape(
    n_layer: int,
    n_embd: int,
    n_head: int,
    vocab_size: int,
    block_size: int,
    n_kv_head: int | None = None,
    head_dim: int | None = None,
    norm: str = "layernorm",
    norm_bias: bool = False,
    qkv_bias: bool = False,
    out_bias: bool | None = None,
    mlp: str = "gelu",
    mlp_hidden: int | None = None,
    mlp_bias: bool = False,
    tied: bool = True,
    positions: str = "learned",
    block: str = "sequential",
    norm_eps: float = DEFAULT_NORM_EPS,
    in_domain: bool = True,
) -> WholeModelShape:
    """Validate and fill defaults (``G = H``, ``D = E/H``, ``F = 4E``, output bias = ``qkv_bias``).

    Raises ValueError for a shape outside the closed forms' domain (see :func:`check_domain`) unless
    ``in_domain`` is False: a checkpoint's shape, whose moves (docs/design.md §16) need its classes' names,
    not the measurement's domain.
    """
    attention = layer_shape(
        n_embd, n_head, n_kv_head, head_dim, None, positions == "rope", qkv_bias, out_bias
    )
    mlp_hidden = 4 * n_embd if mlp_hidden is None else mlp_hidden
    for name, value in (
        ("n_layer", n_layer),
        ("vocab_size", vocab_size),
        ("block_size", block_size),
        ("mlp_hidden", mlp_hidden),
    ):
        if isinstance(value, bool) or int(value) != value or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    for name, option, allowed in (
        ("norm", norm, NORMS),
        ("mlp", mlp, MLPS),
        ("positions", positions, POSITIONS),
        ("block", block, BLOCKS),
    ):
        if option not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {option!r}")
    if norm == "rmsnorm" and norm_bias:
        raise ValueError("RMSNorm has no bias: norm_bias needs norm=layernorm")
    if not norm_eps >= 0:
        raise ValueError(f"norm_eps must be >= 0, got {norm_eps!r}")
    shape = WholeModelShape(
        int(n_layer),
        attention,
        int(vocab_size),
        int(block_size),
        norm,
        bool(norm_bias),
        mlp,
        int(mlp_hidden),
        bool(mlp_bias),
        bool(tied),
        positions,
        block,
        float(norm_eps),
    )
    if in_domain:
        check_domain(shape)
    return shape


def stream_dim(shape: WholeModelShape) -> int:
    """``E'``: the dimension a norm's output varies over (``E - 1`` for LayerNorm, ``E`` for RMSNorm)."""
    return shape.attention.n_embd - 1 if shape.norm == "layernorm" else shape.attention.n_embd


def embedding_span(shape: WholeModelShape) -> int:
    """``sigma_0``: the dimension of the span of the first layer's inputs ``wte[t] + wpe[p]``:
    ``min(E, V + T - 1)`` with learned positions (``wte[t] + wpe[0]`` and the differences
    ``wpe[p] - wpe[0]``), ``min(E, V)`` without."""
    inputs = shape.vocab_size + (shape.block_size - 1 if shape.positions == "learned" else 0)
    return min(shape.attention.n_embd, inputs)


def first_norm_dim(shape: WholeModelShape) -> int:
    """``s_0 = min(sigma_0, E')``: the dimension the first norm's output spans (LayerNorm projects the
    span onto the hyperplane orthogonal to ``1_E``, which keeps ``sigma_0 < E`` dimensions)."""
    return min(embedding_span(shape), stream_dim(shape))


def first_query_dim(shape: WholeModelShape) -> int:
    """``s_q``: what the first layer's *queries* see. The query at position 0 has one key to attend to, so
    its scores never matter; the queries that do read positions ``1 .. T-1``, whose inputs span
    ``min(E, V + T - 2)`` dimensions with learned positions (one position fewer), ``min(E, V)`` without."""
    if shape.positions != "learned":
        return first_norm_dim(shape)
    return min(shape.attention.n_embd, shape.vocab_size + shape.block_size - 2, stream_dim(shape))


def check_domain(shape: WholeModelShape) -> None:
    """Raise ValueError for shapes the closed forms do not cover.

    * Only the first norm may see less than the whole stream (class ``first_layer_span``): the
      attention output added before the next norm must fill it, ``sigma_0 + min(E, H D) >= E``.
    * When the first layer's queries see less than the stream (``s_q < E'``), a vocabulary smaller than
      the head dimension, or offsets (biases), leave more null directions than these classes count
      (measured: ``H (D - V)^2`` with ``V < D``, one more with biases, in the cases tried); so the low-span
      regime needs ``V >= D`` and no offsets.
    * Without learned positions the first layer's readers see only ``V`` distinct inputs; the closed
      forms need ``V >= E + 2`` (measured at ``V = E + 1``: ``E`` more null directions with q/k/v biases,
      a few more with an output bias and ``D = 2``).
    * RoPE's commutant count (Prop. 4.8) assumes ``D <= E'`` (full-rank query and key maps).
    * Attention needs ``T >= 2`` positions to see its scores at all, and ``E >= 4`` (at ``E = 3`` a tied
      LayerNorm model keeps the one rotation of its 2-dimensional stream for every ``V``).
    * In a parallel block the first layer's MLP reads the norm of the embeddings alone, so it sees only
      ``N = V`` (``V T`` with learned positions) distinct inputs: a table, not a function. The closed forms
      need ``N >= R + F + E + 2`` (``R`` the MLP's reader rows, ``F`` or ``2F``); below it the measurement
      finds more null directions (docs/theory.md), which no symmetry explains.
    """
    attention, v, t = shape.attention, shape.vocab_size, shape.block_size
    e, d = attention.n_embd, attention.head_dim
    if embedding_span(shape) + min(e, attention.n_head * d) < e:
        raise ValueError(
            f"the embeddings span {embedding_span(shape)} dimensions and the attention output "
            f"{min(e, attention.n_head * d)}: the second norm does not see the whole "
            f"residual stream, outside the closed forms' domain"
        )
    if first_query_dim(shape) < stream_dim(shape) and (v < d or offsets_exist(shape)):
        raise ValueError(
            f"the first layer's queries span {first_query_dim(shape)} < {stream_dim(shape)} dimensions, "
            f"with vocab_size = {v} < head_dim = {d} or with offsets (biases): outside the "
            f"closed forms' domain"
        )
    needed_vocab = e + 2
    if shape.positions != "learned" and v < needed_vocab:
        raise ValueError(
            f"vocab_size = {v} < {needed_vocab} without learned positions: the first layer's readers "
            f"see too few distinct inputs, outside the closed forms' domain"
        )
    if shape.positions == "rope" and d > first_norm_dim(shape):
        raise ValueError(
            f"RoPE with head_dim = {d} > {first_norm_dim(shape)}, the dimensions its "
            f"first norm spans, is not covered"
        )
    if t < 2:
        raise ValueError(
            f"block_size must be at least 2 (attention over one position has no scores), got {t}"
        )
    if e < 4:
        raise ValueError(
            f"n_embd must be at least 4, got {e} (a 2-dimensional LayerNorm stream keeps one more "
            f"rotation when tied)"
        )
    if shape.block == "parallel":
        inputs = v * (t if shape.positions == "learned" else 1)
        needed = mlp_reader_rows(shape) + shape.mlp_hidden + e + 2
        if inputs < needed:
            raise ValueError(
                f"parallel block: the first MLP sees only {inputs} distinct inputs, fewer than the "
                f"{needed} the closed forms need"
            )


# ---------------------------------------------------------------------------------------------
# Readers: the norm junctions. A junction is one norm followed by the linear maps that read it.


@dataclass(frozen=True)
class Junction:
    """One norm and its readers: ``rows_biased`` / ``rows_plain`` reader rows with / without a bias.
    ``free`` is False for the final norm of a tied model, whose reader is the embedding too."""

    name: str
    rows_biased: int
    rows_plain: int
    free: bool = True


def attention_reader_rows(shape: WholeModelShape) -> int:
    """Rows of ``W_Q``, ``W_K``, ``W_V``: ``HD + 2GD``."""
    attention = shape.attention
    return (attention.n_head + 2 * attention.n_kv_head) * attention.head_dim


def mlp_reader_rows(shape: WholeModelShape) -> int:
    """Rows of ``c_fc`` (``F``), or of the gate and up projections of a gated MLP (``2F``)."""
    return shape.mlp_hidden * (2 if shape.mlp in GATED_MLPS else 1)


def junctions(shape: WholeModelShape) -> list[Junction]:
    """Every norm of the model with its readers, in order: per layer ``ln_1`` (attention) and
    ``ln_2`` (MLP), or one shared norm in a parallel block; then ``ln_f`` with ``lm_head``."""
    attn, mlp = attention_reader_rows(shape), mlp_reader_rows(shape)
    per_layer = []
    if shape.block == "parallel":
        per_layer.append(
            Junction(
                "ln",
                attn * shape.attention.bias + mlp * shape.mlp_bias,
                attn * (not shape.attention.bias) + mlp * (not shape.mlp_bias),
            )
        )
    else:
        per_layer.append(Junction("ln_1", attn * shape.attention.bias, attn * (not shape.attention.bias)))
        per_layer.append(Junction("ln_2", mlp * shape.mlp_bias, mlp * (not shape.mlp_bias)))
    layers = [
        Junction(f"h{layer}.{j.name}", j.rows_biased, j.rows_plain)
        for layer in range(shape.n_layer)
        for j in per_layer
    ]
    return layers + [Junction("ln_f", 0, shape.vocab_size, free=not shape.tied)]


def offsets_exist(shape: WholeModelShape) -> bool:
    """Whether the attention's inputs carry constant offsets: a q/k/v bias, or a LayerNorm bias
    (``W (gamma * n + beta) = W diag(gamma) n + W beta``)."""
    return shape.attention.bias or shape.norm_bias


# ---------------------------------------------------------------------------------------------
# The classes. Each returns its dimension for the whole model.


def attention_qk_dim(shape: WholeModelShape) -> int:
    """Query-key ``GL_D`` per key group (Lemma 4.3, §4.9), or the RoPE commutant, ``D`` per group
    (Prop. 4.8), on the ``E'``-dimensional space the norm's output spans. A query offset is one more
    column of the query side. ``L G nu(D, (H/G)(E' + [offset]), E')``, i.e. ``L G D^2`` when ``D < E'``."""
    attention = shape.attention
    if shape.positions == "rope":
        return shape.n_layer * attention.n_kv_head * counts.rope_commutant_dim(attention.head_dim)

    def per_layer(query_in: int, key_in: int) -> int:
        query_columns = attention.heads_per_group * (query_in + offsets_exist(shape))
        return attention.n_kv_head * counts.factor_pair_nullity(attention.head_dim, query_columns, key_in)

    # the first layer's queries read s_q, its keys s_0 dimensions (first_query_dim, first_norm_dim)
    full = stream_dim(shape)
    return per_layer(first_query_dim(shape), first_norm_dim(shape)) + (shape.n_layer - 1) * per_layer(
        full, full
    )


def attention_ov_dim(shape: WholeModelShape) -> int:
    """Output-value ``GL_C`` per key/value group (Lemma 4.6): the value map reads ``E'`` dimensions and
    the output, for the downstream norms, lives in ``E'`` dimensions. ``L G nu(C, E', (H/G) E')``."""
    e_out, attention = stream_dim(shape), shape.attention

    def per_layer(e_in: int) -> int:
        columns = attention.heads_per_group * e_out
        return attention.n_kv_head * counts.factor_pair_nullity(attention.head_dim, e_in, columns)

    return per_layer(first_norm_dim(shape)) + (shape.n_layer - 1) * per_layer(e_out)


def key_offset_dim(shape: WholeModelShape) -> int:
    """Constant key offsets (a key bias, or ``W_K beta`` of a LayerNorm bias) that softmax cancels (§4.7):
    ``L G D`` without RoPE; under RoPE ``q_i^T R_{j-i} b`` varies with ``j``, so 0."""
    if not offsets_exist(shape) or shape.positions == "rope":
        return 0
    return shape.n_layer * shape.attention.n_kv_head * shape.attention.head_dim


def absorbing_output_bias(shape: WholeModelShape) -> bool:
    """Whether a constant added to the attention's output can be taken back by a bias at the same place:
    the output bias, or in a parallel block the MLP's down-projection bias (both land in one sum)."""
    return shape.attention.out_bias or (shape.block == "parallel" and shape.mlp_bias)


def value_offset_dim(shape: WholeModelShape) -> int:
    """Constant value offsets, which reach the stream only pooled (attention rows sum to one, §4.7):
    all ``G C`` per layer when a bias can absorb the pooled constant (:func:`absorbing_output_bias`), else
    ``max(0, G C - E')`` (the kernel of the pooling map into the ``E'`` dimensions the norms see)."""
    if not offsets_exist(shape):
        return 0
    value_offsets = shape.attention.n_kv_head * shape.attention.head_dim
    per_layer = value_offsets if absorbing_output_bias(shape) else max(0, value_offsets - stream_dim(shape))
    return shape.n_layer * per_layer


def parallel_output_bias_dim(shape: WholeModelShape) -> int:
    """A parallel block with both output biases adds ``b_O + b_down``: ``b_O + d``, ``b_down - d`` is
    invisible, ``E'`` per layer (under LayerNorm the ``d = 1_E`` direction is ``writer_mean``'s)."""
    if shape.block != "parallel" or not (shape.attention.out_bias and shape.mlp_bias):
        return 0
    return shape.n_layer * stream_dim(shape)


def first_layer_span_dim(shape: WholeModelShape) -> int:
    """The first norm's output spans only ``s_0 = first_norm_dim`` of the ``E'`` dimensions when the
    embeddings span fewer (``V + T - 1 < E``, e.g. a character model with a wide stream): each key, value
    (and, in a parallel block, MLP) row of the first junction has ``E' - s_0`` columns that no input
    reaches, each query row ``E' - s_q`` (:func:`first_query_dim`)."""
    first = junctions(shape)[0]
    query_rows = shape.attention.n_head * shape.attention.head_dim
    other_rows = first.rows_biased + first.rows_plain - query_rows
    full = stream_dim(shape)
    return query_rows * (full - first_query_dim(shape)) + other_rows * (full - first_norm_dim(shape))


def norm_gain_dim(shape: WholeModelShape) -> int:
    """``gamma -> s * gamma`` with every reader's columns divided by ``s``: ``E`` per norm whose readers are
    free (not the final norm of a tied model, whose reader is also the embedding)."""
    return shape.attention.n_embd * sum(j.free for j in junctions(shape))


def norm_bias_dim(shape: WholeModelShape) -> int:
    """A LayerNorm bias ``beta -> beta + delta``, absorbed by the readers: ``E`` per free junction (into
    their biases, or, for readers without one, into their components along ``1/gamma``, class
    ``reader_mean``). Tied: the final bias reaches the logits as ``W beta``, which log-softmax ignores
    along ``1_V``: ``dim {delta: W delta in span 1_V} = max(0, E - V + 1)`` (log-probabilities only)."""
    if not shape.norm_bias:
        return 0
    free = sum(j.free for j in junctions(shape))
    final_tied = max(0, shape.attention.n_embd - shape.vocab_size + 1) if shape.tied else 0
    return shape.attention.n_embd * free + final_tied


def reader_mean_dim(shape: WholeModelShape) -> int:
    """LayerNorm's output ``gamma * n + beta`` has ``n`` orthogonal to ``1_E``, so a reader row may add any
    multiple of ``1/gamma`` (``W -> W + u (1/gamma)^T``). A row with a bias absorbs the constant this adds
    (``u (1/gamma . beta)``); without a bias and with a LayerNorm bias the row's component is spent on
    absorbing ``beta`` (``norm_bias``). One per reader row of every free junction; 0 for RMSNorm."""
    if shape.norm != "layernorm":
        return 0
    return sum(j.rows_biased + (0 if shape.norm_bias else j.rows_plain) for j in junctions(shape) if j.free)


def writer_mean_dim(shape: WholeModelShape) -> int:
    """Every later read of the residual stream is a LayerNorm, which subtracts the mean: a write along
    ``1_E`` is invisible. Each column of ``W_O`` (``HC``) and of the MLP's down projection (``F``), and each
    output bias, may add a multiple of ``1_E``. 0 for RMSNorm."""
    if shape.norm != "layernorm":
        return 0
    attention = shape.attention
    per_layer = attention.n_head * attention.head_dim + shape.mlp_hidden + attention.out_bias + shape.mlp_bias
    return shape.n_layer * per_layer


def embedding_mean_dim(shape: WholeModelShape) -> int:
    """Embedding rows along ``1_E`` (LayerNorm only): each ``wpe`` row (``T``) and, untied, each ``wte``
    row (``V``). Tied, a ``wte`` row is also a logit row and ``a_v (1 . y)`` must be the same for every
    token: only ``wte -> wte + a 1_V 1_E^T`` (1, log-probabilities only)."""
    if shape.norm != "layernorm":
        return 0
    tokens = 1 if shape.tied else shape.vocab_size
    return tokens + (shape.block_size if shape.positions == "learned" else 0)


def position_shift_dim(shape: WholeModelShape) -> int:
    """``wte -> wte + 1_V w^T``, ``wpe -> wpe - 1_T w^T`` leaves every input ``wte[t] + wpe[p]`` unchanged
    (learned positions only). Tied, the logits move by ``w . y`` for every token alike, which log-softmax
    cancels. ``E``, less the ``w = 1_E`` direction that ``embedding_mean`` already holds under LayerNorm."""
    if shape.positions != "learned":
        return 0
    return shape.attention.n_embd - (1 if shape.norm == "layernorm" else 0)


def logit_shift_dim(shape: WholeModelShape) -> int:
    """Untied: ``lm_head -> lm_head + 1_V w^T`` adds ``w . y`` to every logit, which log-softmax cancels
    (log-probabilities only): ``E'`` directions on the final norm's output, plus one for its constant
    offset when it has a LayerNorm bias. (Tied, the same move is ``position_shift``.)"""
    if shape.tied:
        return 0
    return stream_dim(shape) + (1 if shape.norm_bias else 0)


def gated_mlp_scale_dim(shape: WholeModelShape) -> int:
    """Gated MLP ``W_down (act(W_gate x) * (W_up x))``: scale hidden unit ``k``'s up row (and bias) by ``s_k``
    and its down column by ``1/s_k``: ``L F``."""
    return shape.n_layer * shape.mlp_hidden if shape.mlp in GATED_MLPS else 0


def tied_rotation_dim(n_embd: int, vocab_size: int, norm: str) -> int:
    """Stream rotations a tied model keeps: the rotation ``Q`` of the whole stream (class
    ``stream_rotation``) is compatible with ``lm_head = wte`` only if the final norm's gain change and
    log-softmax absorb ``W [Gamma, Omega]`` (docs/theory.md). With ``V > E`` (every real model) none
    survives; for small vocabularies:

    * RMSNorm: symmetric ``X`` with range in ``W^{-1} span(1_V)`` (dimension ``E - V + 1``):
      ``(E - V + 1)(E - V + 2) / 2`` for ``V <= E``;
    * LayerNorm: ``max(0, (E - V)(E - V + 1)/2 - V + 5)`` for ``V >= 3``, ``(E^2 - 3E + 6)/2`` for ``V = 2``.
    """
    e, v = n_embd, vocab_size
    if norm == "rmsnorm":
        k = e - v + 1
        return k * (k + 1) // 2 if k > 0 else 0
    if v == 2:
        return (e * e - 3 * e + 6) // 2
    return max(0, (e - v) * (e - v + 1) // 2 - v + 5) if v <= e else 0


def stream_rotation_dim(shape: WholeModelShape) -> int:
    """Rotate the whole residual stream: ``x -> Q x`` with ``Q`` orthogonal (and ``Q 1_E = 1_E`` under
    LayerNorm), so every norm's ``n -> Q n``; writers (``wte``, ``wpe``, ``W_O``, the down projection and
    their biases) become ``Q W``, each reader ``W diag(gamma) Q^T diag(gamma)^-1`` (and a LayerNorm bias
    ``diag(gamma) Q diag(gamma)^-1 beta``). Untied: ``dim so(E') = E'(E' - 1)/2``. Tied: see
    :func:`tied_rotation_dim`."""
    if shape.tied:
        return tied_rotation_dim(shape.attention.n_embd, shape.vocab_size, shape.norm)
    e_in = stream_dim(shape)
    return e_in * (e_in - 1) // 2


def residual_scale_dim(shape: WholeModelShape) -> int:
    """Scale every write into the stream by ``lambda`` (and, tied, the final norm's gain and bias by
    ``1/lambda``): every norm's output is unchanged only without epsilon (``norm(lambda x) = norm(x)`` needs
    ``eps = 0``). 1 when ``norm_eps == 0``; otherwise a near-symmetry, reported, not counted."""
    return 1 if shape.norm_eps == 0 else 0


def eps_broken_dim(shape: WholeModelShape) -> int:
    """Directions that only the norms' epsilon breaks: the residual scaling when ``norm_eps > 0`` (then
    ``residual_scale`` counts 0), else none. Its singular value is proportional to epsilon
    (docs/theory.md, "The measurement"), so it may lie anywhere between round-off and the informative
    spectrum: the census's cut allows for it (:func:`attnid.theory.census.spectrum_cut`)."""
    return 1 - residual_scale_dim(shape)


@dataclass(frozen=True)
class SymmetryClass:
    name: str
    dimension: Callable[[WholeModelShape], int]
    summary: str
    logprobs_only: str = ""  # when the class exists for the log-probabilities but not for the raw logits


CLASSES: tuple[SymmetryClass, ...] = (
    SymmetryClass("attention_qk", attention_qk_dim, "query-key GL_D per key group (RoPE: its commutant)"),
    SymmetryClass("attention_ov", attention_ov_dim, "output-value GL_C per key/value group"),
    SymmetryClass("key_offset", key_offset_dim, "constant key offsets cancelled by softmax"),
    SymmetryClass("value_offset", value_offset_dim, "value offsets pooled through W_O"),
    SymmetryClass("parallel_output_bias", parallel_output_bias_dim, "parallel block: b_O + d, b_down - d"),
    SymmetryClass(
        "first_layer_span", first_layer_span_dim, "first readers' columns outside the embeddings' span"
    ),
    SymmetryClass("norm_gain", norm_gain_dim, "norm gain against its readers' columns"),
    SymmetryClass(
        "norm_bias",
        norm_bias_dim,
        "LayerNorm bias absorbed by its readers (tied ln_f: by log-softmax)",
        "its tied ln_f part",
    ),
    SymmetryClass(
        "reader_mean", reader_mean_dim, "reader rows along 1/gamma (LayerNorm output is orthogonal to 1)"
    ),
    SymmetryClass("writer_mean", writer_mean_dim, "writes along 1_E (LayerNorm subtracts the mean)"),
    SymmetryClass("embedding_mean", embedding_mean_dim, "embedding rows along 1_E", "its tied wte part"),
    SymmetryClass("position_shift", position_shift_dim, "wte + 1 w^T, wpe - 1 w^T", "when tied"),
    SymmetryClass("logit_shift", logit_shift_dim, "lm_head + 1_V w^T", "always"),
    SymmetryClass("gated_mlp_scale", gated_mlp_scale_dim, "gated MLP: up row s, down column 1/s"),
    SymmetryClass(
        "stream_rotation",
        stream_rotation_dim,
        "orthogonal rotation of the residual stream",
        "when tied (V <= E)",
    ),
    SymmetryClass(
        "residual_scale", residual_scale_dim, "global scale of the stream (exact only with eps = 0)"
    ),
)
CLASS_NAMES = tuple(c.name for c in CLASSES)
# Coarser groups of the classes, for the columns of table A4 (every class in exactly one group).
CLASS_GROUPS = {
    "attention": ("attention_qk", "attention_ov", "key_offset", "value_offset"),
    "norm_readers": ("norm_gain", "norm_bias", "reader_mean", "first_layer_span"),
    "stream_writes": (
        "writer_mean",
        "embedding_mean",
        "position_shift",
        "parallel_output_bias",
        "residual_scale",
    ),
    "logits": ("logit_shift",),
    "rotation": ("stream_rotation",),
    "gated_mlp": ("gated_mlp_scale",),
}


def class_dims(shape: WholeModelShape) -> dict[str, int]:
    """Every class's dimension, in census order."""
    return {c.name: int(c.dimension(shape)) for c in CLASSES}


def whole_model_unidentified(shape: WholeModelShape) -> int:
    """The closed-form nullity of the whole model's log-probabilities: the sum of every class."""
    return sum(class_dims(shape).values())


def attention_params(shape: WholeModelShape) -> int:
    """Every layer's attention parameters (:func:`attnid.theory.counts.attention_params_per_layer`)."""
    return shape.n_layer * counts.attention_params_per_layer(shape.attention)


def attention_only_unidentified(shape: WholeModelShape) -> int:
    """What the paper counts: ``L`` times one attention layer's nullity (:mod:`attnid.theory.counts`)."""
    return shape.n_layer * counts.unidentified_params_per_layer(shape.attention)


def norm_params(shape: WholeModelShape) -> int:
    return shape.attention.n_embd * (1 + shape.norm_bias)


def mlp_params(shape: WholeModelShape) -> int:
    e, f = shape.attention.n_embd, shape.mlp_hidden
    if shape.mlp in GATED_MLPS:
        return 3 * e * f + (2 * f + e) * shape.mlp_bias
    return 2 * e * f + (f + e) * shape.mlp_bias


def whole_model_params(shape: WholeModelShape) -> int:
    """Every parameter: embeddings, per layer norms + attention + MLP, final norm, untied ``lm_head``."""
    e = shape.attention.n_embd
    embeddings = shape.vocab_size * e + (shape.block_size * e if shape.positions == "learned" else 0)
    norms_per_layer = 1 if shape.block == "parallel" else 2
    per_layer = norms_per_layer * norm_params(shape) + mlp_params(shape)
    head = 0 if shape.tied else shape.vocab_size * e
    return embeddings + shape.n_layer * per_layer + attention_params(shape) + norm_params(shape) + head
