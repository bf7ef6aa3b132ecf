"""The plan: what a pipeline config trains, checked in one place (docs/design.md §6).

:func:`plan` reads a pipeline config (:mod:`.config`, against the schema of :mod:`.schema`, whose run
settings come from ``attnid.training.config.TrainConfig``), lays out every training run of every stage
(:mod:`.runs`: the cases, the sweeps, the studies of :mod:`.studies`, the edits, the interventions of
:mod:`.interventions`; the quantization stage's checkpoints, :mod:`.quantization`; the alignment
stage's pairs, :mod:`.alignment`) as a :class:`RunSpec`
per run directory, and gives each run's spec file for ``attnid train --config`` (:func:`spec_texts`: the
text a job of the workflow writes; nothing here writes a file). :func:`output_layout` names the build's
folders and the files its rules declare (:mod:`.layout`); :func:`as_one_build` holds the lock that keeps a
second build of the same ``results_dir`` out (:mod:`.builds`). Every problem of a config is one
:class:`ConfigError`. The workflow
(``workflow/rules/common.smk``) imports only this package's names below. May import: ``training``,
``measure``, ``model``, ``theory``, ``common``.
"""

from attnid.common.tex import why_no_pdf
from attnid.plan.alignment import AlignmentPair, alignment_pairs, alignment_settings
from attnid.plan.builds import as_one_build
from attnid.plan.config import check_config_file, check_writable
from attnid.plan.errors import ConfigError
from attnid.plan.interventions import margin_fraction, verdict_options
from attnid.plan.layout import Layout, output_layout, run_files
from attnid.plan.quantization import quantization_checkpoints, quantization_settings, smollm2_gguf
from attnid.plan.runs import Plan, RunSpec, plan, spec_texts

__all__ = [
    "AlignmentPair",
    "alignment_pairs",
    "alignment_settings",
    "ConfigError",
    "Layout",
    "Plan",
    "RunSpec",
    "as_one_build",
    "check_config_file",
    "check_writable",
    "plan",
    "margin_fraction",
    "output_layout",
    "quantization_checkpoints",
    "quantization_settings",
    "run_files",
    "smollm2_gguf",
    "spec_texts",
    "verdict_options",
    "why_no_pdf",
]
