"""The plan: what a pipeline config trains, checked in one place (docs/design.md §6).

:func:`plan` reads a pipeline config (:mod:`.config`, against the schema of :mod:`.schema`, whose run
settings come from ``attnid.training.config.TrainConfig``), lays out every training run of every stage
(:mod:`.runs`: the cases, the sweeps, the studies of :mod:`.studies`, the edits, the interventions of
:mod:`.interventions`) as a :class:`RunSpec` per run directory, and writes each run's spec file for
``attnid train --config``. Every problem of a config is one :class:`ConfigError`. The workflow
(``workflow/rules/common.smk``) imports only this package's names below. May import: ``training``,
``measure``, ``model``, ``theory``, ``common``.
"""

from attnid.plan.config import check_config_file, check_writable
from attnid.plan.errors import ConfigError
from attnid.plan.interventions import verdict_options
from attnid.plan.runs import Plan, RunSpec, plan, write_spec_files

__all__ = [
    "ConfigError",
    "Plan",
    "RunSpec",
    "check_config_file",
    "check_writable",
    "plan",
    "verdict_options",
    "write_spec_files",
]
