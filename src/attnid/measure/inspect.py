"""What ``attnid inspect`` reports about a checkpoint: per layer μ and the conserved imbalance on the
architecture's own orbit, the orbit's dimension at the weights next to the closed form, and the
identification counts of the layer's shape (docs/design.md §3.4, §5, §8)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable
from typing import Any

import torch

from attnid.measure.metrics import excess_norm
from attnid.model.layout import (
    AttentionLayout,
    LayerTensors,
    attention_tensors,
    layer_shape_of,
    layout_of,
    orbit_of,
    pairs_from_tensors,
)
from attnid.theory import counts
from attnid.theory.circuits import CIRCUITS

# inspect's names for counts.layer_counts' per-layer entries (the keys of ``attnid inspect --json``)
INSPECT_COUNT_KEYS = {
    "attention_params": "attn_params_per_layer",
    "unidentified_qk": "unidentified_qk_per_layer",
    "unidentified_ov": "unidentified_ov_per_layer",
    "unidentified_bias": "unidentified_bias_per_layer",
    "unidentified": "unidentified_per_layer",
    "identified_fraction": "identified_fraction",
}


def _layer_counts(shape: counts.LayerShape) -> dict[str, int | float]:
    """Attention parameters and unidentified ones in one layer of this shape: ``D²`` per key/value group
    in the query-key product (``D`` with RoPE, Prop. 4.8; Cor. 4.4), ``C²`` in the output-value product
    (Lemma 4.6), and with biases the key and value biases (§4.7); from
    :func:`attnid.theory.counts.layer_counts`."""
    per_layer = counts.layer_counts(shape)
    return {ours: per_layer[theirs] for ours, theirs in INSPECT_COUNT_KEYS.items()}


@torch.no_grad()
def inspect_model(model: torch.nn.Module) -> dict:
    """:func:`inspect_layers` of a GPT (MHA, GQA, RoPE, a head width of its own), at its live weights."""
    return inspect_layers(layout_of(model), layer_shape_of(model), attention_tensors(model))


@torch.no_grad()
def inspect_layers(
    layout: AttentionLayout, shape: counts.LayerShape, tensors_per_layer: Iterable[LayerTensors]
) -> dict:
    """Per layer: μ and the conserved imbalance norm of both circuits on the architecture's own orbit, the
    orbit's dimension at the weights (the tangent map's rank) next to the closed form of
    :mod:`attnid.theory.counts` for ``shape``, and the identification counts of that shape.

    ``tensors_per_layer``: per layer ``(c_attn.weight, c_attn.bias, c_proj.weight)`` cut by ``layout``
    (:mod:`attnid.model.layout`), a model's live tensors or a checkpoint's float64 copies.
    """
    orbits = {c: orbit_of(layout, c) for c in CIRCUITS}
    closed_form = {"qk": counts.unidentified_qk_params(shape), "ov": counts.unidentified_ov_params(shape)}
    counted = _layer_counts(shape)
    layers = []
    zero = torch.zeros((), dtype=torch.float64)
    totals = {c: [zero.clone(), zero.clone()] for c in CIRCUITS}  # sum of ||A||^2 + ||B||^2, of its minimum
    for layer, tensors in enumerate(tensors_per_layer):
        row: dict[str, Any] = {
            "layer": layer,
            "heads": layout.n_head,
            "kv_heads": layout.n_kv_head,
            "head_dim": layout.head_dim,
            "rope": layout.rope,
        }
        matches = True
        for circuit in CIRCUITS:
            pair_a, pair_b = pairs_from_tensors(*tensors, layout, circuit)  # (G, D, n) each
            frobenius_sq, minimum = orbits[circuit].excess_norm_terms(pair_a, pair_b)
            totals[circuit][0] += frobenius_sq.sum().cpu()
            totals[circuit][1] += minimum.sum().cpu()
            row[f"mu_{circuit}"] = excess_norm(frobenius_sq, minimum)
            conserved = orbits[circuit].conserved_imbalance(pair_a, pair_b)
            row[f"imbalance_norm_{circuit}"] = float(conserved.square().sum().sqrt())
            row[f"orbit_{circuit}"] = orbits[circuit].name
            row[f"orbit_dim_{circuit}"] = orbits[circuit].tangent_rank(pair_a, pair_b)
            matches &= row[f"orbit_dim_{circuit}"] == closed_form[circuit]
        row.update(counted)
        row["orbit_matches_closed_form"] = matches
        layers.append(row)
    summary = {f"mu_{c}": excess_norm(*totals[c]) for c in CIRCUITS}
    for circuit in CIRCUITS:  # sqrt of the sum over layers of ||I||_F^2
        squares = sum(r[f"imbalance_norm_{circuit}"] ** 2 for r in layers)
        summary[f"imbalance_norm_{circuit}"] = math.sqrt(squares)
    summary["attention_params"] = sum(r["attention_params"] for r in layers)
    summary["unidentified"] = sum(r["unidentified"] for r in layers)
    summary["identified_fraction"] = 1 - summary["unidentified"] / summary["attention_params"]
    summary["orbit_matches_closed_form"] = all(r["orbit_matches_closed_form"] for r in layers)
    return {
        "n_layer": len(layers),
        "n_head": layout.n_head,
        "n_kv_head": layout.n_kv_head,
        "head_dim": layout.head_dim,
        "rope": layout.rope,
        "n_embd": layout.n_embd,
        "bias": layout.bias,
        "layers": layers,
        "total": summary,
    }


def inspection_csv(report: dict) -> str:
    """The per-layer rows of a report as CSV (a header line, one line per layer), for scripts."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(report["layers"][0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(report["layers"])
    return buffer.getvalue()


# attnid inspect's table: (header, report key, format) per column; the legend under it says what each is
# (§n: docs/design.md's sections; lemmas: the paper's)
INSPECT_COLUMNS = (
    ("layer", "layer", "{}"),
    ("heads", "heads", "{}"),
    ("mu_qk", "mu_qk", "{:.4g}"),
    ("mu_ov", "mu_ov", "{:.4g}"),
    ("|I_qk|_F", "imbalance_norm_qk", "{:.4g}"),
    ("|I_ov|_F", "imbalance_norm_ov", "{:.4g}"),
    ("attn params", "attention_params", "{}"),
    ("orbit qk", "orbit_qk", "{}"),
    ("dim qk", "orbit_dim_qk", "{}"),
    ("unid qk", "unidentified_qk", "{}"),
    ("dim ov", "orbit_dim_ov", "{}"),
    ("unid ov", "unidentified_ov", "{}"),
    ("unid bias", "unidentified_bias", "{}"),
    ("unid", "unidentified", "{}"),
    ("identified", "identified_fraction", "{:.6f}"),
)
INSPECT_LEGEND = (
    (
        "mu_qk, mu_ov",
        "excess norm of the query-key and output-value pairs over their orbit's minimum "
        "(0 = balanced; docs/design.md §3.4)",
    ),
    ("|I_qk|_F, |I_ov|_F", "Frobenius norm of the conserved imbalance A A^T - B B^T (§3.2)"),
    ("attn params", "attention parameters of the layer (weights and biases of Q, K, V and the output)"),
    ("orbit qk", "the query-key pair's orbit: gl (all of GL_D) or rope (the RoPE commutant, §8)"),
    ("dim qk, dim ov", "orbit dimension measured at these weights (the tangent map's rank, §9)"),
    ("unid qk, unid ov", "unidentified parameters by the closed forms (Lemmas 4.1-4.6, Prop. 4.8; §5.1)"),
    ("unid bias", "unidentified key and value biases (§4.7 of the paper)"),
    ("unid", "their sum"),
    ("identified", "the identified share of the attention parameters, 1 - unid / attn params (§5.1)"),
    ("dim = closed form", "whether both measured dimensions equal the closed forms"),
    (
        "total",
        "the whole model: parameters summed over layers, mu over all pairs pooled, |I|_F the root of "
        "the summed squares",
    ),
)


def format_inspection(report: dict) -> str:
    """``attnid inspect``'s table: the model's shape, one row per layer, a labelled total row, a legend."""
    headers = [header for header, _, _ in INSPECT_COLUMNS] + ["dim = closed form"]
    cells = [
        [fmt.format(row[key]) for _, key, fmt in INSPECT_COLUMNS]
        + [("yes" if row["orbit_matches_closed_form"] else "MISMATCH")]
        for row in report["layers"]
    ]
    total = dict(report["total"])
    for key in ("unidentified_qk", "unidentified_ov", "unidentified_bias"):  # summed like attn params
        total[key] = sum(row[key] for row in report["layers"])
    cells.append(
        [
            fmt.format(total[key]) if key in total else ("total" if key == "layer" else "")
            for _, key, fmt in INSPECT_COLUMNS
        ]
        + ["yes" if total["orbit_matches_closed_form"] else "MISMATCH"]
    )
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    source = "".join(f"{key}={report[key]} " for key in ("format", "model_type", "dtype") if report.get(key))
    lines = [
        f"{source}n_layer={report['n_layer']} n_head={report['n_head']} n_kv_head={report['n_kv_head']} "
        f"head_dim={report['head_dim']} rope={report['rope']} n_embd={report['n_embd']} "
        f"bias={report['bias']}",
        "  ".join(h.rjust(w) for h, w in zip(headers, widths)),
    ]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    name_width = max(len(name) for name, _ in INSPECT_LEGEND)
    lines += ["", "columns:"] + [f"  {name:<{name_width}}  {text}" for name, text in INSPECT_LEGEND]
    return "\n".join(lines)
