"""Real architectures: the entries of ``architectures.yaml`` (shipped with the package beside this
module) and of Hugging Face configs (:mod:`attnid.theory.hf_config`), checked, and their tables.

An entry is a mapping of fields (docs/theory.md): the attention's (``n_layer``, ``n_embd``, ``n_head``,
``n_kv_head``, ``head_dim``, ``value_dim``, ``rope``, ``bias``, ``out_bias``), the whole model's
(:data:`WHOLE_MODEL_KEYS`) and a ``source``. From them come one row each of

* ``counts.csv`` (tables A1, A1b): the attention counts of :mod:`attnid.theory.counts` (claims T1-T5);
* ``single_head.csv`` (table A3): the §4.10 single-head match (T6, docs/design.md §10);
* ``whole_model.csv`` (table A4): every symmetry class of :mod:`attnid.theory.whole_model`.

Pure functions of the parsed entries: reading the file is the command line's
(:func:`attnid.cli.theory.load_architectures`).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnid.common.errors import UserError
from attnid.theory import whole_model
from attnid.theory.counts import architecture_shape, layer_counts, single_head_row

if TYPE_CHECKING:
    import pandas as pd

# The published architectures: the one copy, package data, read by ``attnid counts`` and the workflow.
PACKAGED_ARCHITECTURES = Path(__file__).with_name("architectures.yaml")
ATTENTION_KEYS = (
    "n_layer",
    "n_embd",
    "n_head",
    "n_kv_head",
    "head_dim",
    "value_dim",
    "rope",
    "bias",
    "out_bias",
)
# The fields the whole-model counts need on top of the attention's.
WHOLE_MODEL_KEYS = (
    "vocab_size",
    "block_size",
    "norm",
    "norm_bias",
    "mlp",
    "mlp_hidden",
    "mlp_bias",
    "tied",
    "block",
    "norm_eps",
)
ARCHITECTURE_KEYS = frozenset(ATTENTION_KEYS + WHOLE_MODEL_KEYS + ("source",))
REQUIRED_KEYS = ("n_layer", "n_embd", "n_head", "source")
POSITIVE_INTEGER_KEYS = ("n_layer", "n_embd", "n_head", "n_kv_head", "head_dim", "value_dim")
FLAG_KEYS = ("rope", "bias", "out_bias")


# ---------------------------------------------------------------------------------------------
# Checking a parsed architectures file


def check_architectures(document: Any, where: str) -> dict[str, dict]:
    """The ``architectures:`` mapping ``name -> entry`` of a parsed ``architectures.yaml`` (``where``
    names the file in errors). Every problem is a one-line UserError naming the entry and the field."""
    entries = document.get("architectures") if isinstance(document, dict) else None
    if not isinstance(entries, dict) or not entries:
        raise UserError(f"{where} must have a non-empty 'architectures:' mapping of name -> shape")
    for name, spec in entries.items():
        check_entry(name, spec, where)
    return entries


def check_entry(name: str, spec: Any, where: str) -> None:
    """One entry's fields: known, present, of their types, and a shape the closed forms cover."""
    if not isinstance(spec, dict):
        raise UserError(f"{where}: architecture {name!r} must be a mapping of fields")
    unknown = set(spec) - ARCHITECTURE_KEYS
    if unknown:
        raise UserError(
            f"{where}: architecture {name!r} has unknown field(s) {sorted(unknown)}; "
            f"allowed: {sorted(ARCHITECTURE_KEYS)}"
        )
    missing = set(REQUIRED_KEYS) - set(spec)
    if missing:
        raise UserError(f"{where}: architecture {name!r} lacks {sorted(missing)}")
    for flag in FLAG_KEYS:
        if flag in spec and not isinstance(spec[flag], bool):
            raise UserError(
                f"{where}: architecture {name!r}: {flag} must be true or false, got {spec[flag]!r}"
            )
    for field in POSITIVE_INTEGER_KEYS:
        if field in spec and (
            isinstance(spec[field], bool) or not isinstance(spec[field], int) or spec[field] < 1
        ):
            raise UserError(
                f"{where}: architecture {name!r}: {field} must be a positive integer, got {spec[field]!r}"
            )
    try:
        architecture_shape(spec)
    except ValueError as err:
        raise UserError(f"{where}: architecture {name!r}: {err}") from None


# ---------------------------------------------------------------------------------------------
# Attention counts (A1, A1b) and the single-head match (A3)


def architecture_row(name: str, spec: dict) -> dict:
    """Per-layer counts and whole-model totals (all layers' attention) for one architecture."""
    shape = architecture_shape(spec)
    n_layer = int(spec["n_layer"])
    per_layer = layer_counts(shape)
    row = {"architecture": name, "n_layer": n_layer, **asdict(shape), **per_layer}
    row["total_attn_weights"] = n_layer * per_layer["attn_weights_per_layer"]
    row["total_attn_params"] = n_layer * per_layer["attn_params_per_layer"]
    row["total_unidentified_qk"] = n_layer * per_layer["unidentified_qk_per_layer"]
    row["total_unidentified"] = n_layer * per_layer["unidentified_per_layer"]
    row["total_identified"] = row["total_attn_params"] - row["total_unidentified"]
    row["source"] = spec["source"]
    return row


def counts_table(architectures: dict[str, dict]) -> pd.DataFrame:
    # lazy: pandas, which 'attnid counts --help' does not wait for
    import pandas as pd

    return pd.DataFrame([architecture_row(name, spec) for name, spec in architectures.items()])


def single_head_table(
    architectures: dict[str, dict], extra_heads: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 32, 64)
) -> pd.DataFrame:
    """§4.10 rows (A3): one per distinct ``(E, H)`` among the architectures (labelled with
    their names; plain MHA with ``D = E/H`` is assumed, as in the paper), then a sweep over
    ``H`` at ``E = 768``. Both readings of docs/design.md §10 are columns of every row."""
    # lazy: pandas, which 'attnid counts --help' does not wait for
    import pandas as pd

    rows: list[dict] = []
    seen: dict[tuple[int, int], list[str]] = {}
    for name, spec in architectures.items():
        key = (int(spec["n_embd"]), int(spec["n_head"]))
        seen.setdefault(key, []).append(name)
    for (n_embd, n_head), names in seen.items():
        rows.append({"label": ", ".join(names), **single_head_row(n_embd, n_head)})
    for n_head in extra_heads:
        rows.append({"label": f"sweep H={n_head}", **single_head_row(768, n_head)})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# The whole model (A4)

WHOLE_MODEL_REQUIRED = ("vocab_size", "norm", "mlp", "mlp_hidden", "tied")
WHOLE_MODEL_KEY_TYPES: dict[str, type | tuple[type, ...]] = {
    "vocab_size": int,
    "block_size": int,
    "mlp_hidden": int,
    "norm": str,
    "mlp": str,
    "block": str,
    "norm_bias": bool,
    "mlp_bias": bool,
    "tied": bool,
    "norm_eps": (int, float),
}
WHOLE_MODEL_TYPE_NAMES = {
    int: "a positive integer",
    str: "a name",
    bool: "true or false",
    (int, float): "a number",
}


def _check_whole_model_fields(name: str, spec: dict) -> None:
    missing = [key for key in WHOLE_MODEL_REQUIRED if key not in spec]
    if not spec.get("rope", False) and "block_size" not in spec:
        missing.append("block_size")
    if missing:
        raise UserError(
            f"architecture {name!r} lacks {', '.join(missing)} (needed for the whole-model count)"
        )
    for key, kind in WHOLE_MODEL_KEY_TYPES.items():
        value = spec.get(key)
        if value is not None and not (
            isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        ):
            raise UserError(
                f"architecture {name!r}: {key} must be {WHOLE_MODEL_TYPE_NAMES[kind]}, got {value!r}"
            )


def shape_from_architecture(name: str, spec: dict, in_domain: bool = True) -> whole_model.WholeModelShape:
    """The whole-model shape of one entry; a UserError names a missing or mistyped field (``in_domain``: as
    :func:`attnid.theory.whole_model.whole_model_shape`)."""
    _check_whole_model_fields(name, spec)
    try:
        return whole_model.whole_model_shape(
            n_layer=spec["n_layer"],
            n_embd=spec["n_embd"],
            n_head=spec["n_head"],
            vocab_size=spec["vocab_size"],
            block_size=spec.get("block_size", 2),
            n_kv_head=spec.get("n_kv_head"),
            head_dim=spec.get("head_dim"),
            norm=spec["norm"],
            norm_bias=spec.get("norm_bias", False),
            qkv_bias=spec.get("bias", False),
            out_bias=spec.get("out_bias"),
            mlp=spec["mlp"],
            mlp_hidden=spec["mlp_hidden"],
            mlp_bias=spec.get("mlp_bias", False),
            tied=spec["tied"],
            positions="rope" if spec.get("rope", False) else "learned",
            block=spec.get("block", "sequential"),
            norm_eps=spec.get("norm_eps", whole_model.DEFAULT_NORM_EPS),
            in_domain=in_domain,
        )
    except (TypeError, ValueError) as err:
        raise UserError(f"architecture {name!r}: {err}") from None


def whole_model_row(name: str, spec: dict) -> dict:
    """One row of ``whole_model.csv``: the attention-only count next to the whole model's, class by class."""
    shape = shape_from_architecture(name, spec)
    dims = whole_model.class_dims(shape)
    attention_params = whole_model.attention_params(shape)
    attention_unidentified = whole_model.attention_only_unidentified(shape)
    params = whole_model.whole_model_params(shape)
    unidentified = sum(dims.values())
    groups = whole_model.CLASS_GROUPS.items()
    return {
        "architecture": name,
        **whole_model.shape_columns(shape),
        "attention_params": attention_params,
        "attention_unidentified": attention_unidentified,
        "attention_identified_fraction": 1 - attention_unidentified / attention_params,
        "whole_params": params,
        "whole_unidentified": unidentified,
        "whole_identified_fraction": 1 - unidentified / params,
        "extra_unidentified": unidentified - attention_unidentified,
        **{f"group_{group}": sum(dims[name] for name in names) for group, names in groups},
        **{f"class_{key}": value for key, value in dims.items()},
    }


def whole_model_table(architectures: dict[str, dict]) -> pd.DataFrame:
    # lazy: pandas, which 'attnid counts --help' does not wait for
    import pandas as pd

    return pd.DataFrame([whole_model_row(name, spec) for name, spec in architectures.items()])


WHOLE_MODEL_COLUMNS = ("whole_params", "whole_unidentified", "whole_identified_fraction")


def whole_model_columns(name: str, spec: dict) -> dict:
    """The whole-model columns of a Hugging Face model's counts row: its parameters, its unidentified count
    over every symmetry class and the identified fraction; a model the census does not cover gets empty
    values and the reason (``whole_model_note``)."""
    note = spec.get("whole_model_note")
    if note is None:
        try:
            row = whole_model_row(name, spec)
        except UserError as err:
            note = str(err)
        else:
            return {key: row[key] for key in WHOLE_MODEL_COLUMNS}
    return {**dict.fromkeys(WHOLE_MODEL_COLUMNS), "whole_model_note": note}
