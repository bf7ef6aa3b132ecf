"""attnid: every number, table and figure of the paper from one command.

    snakemake --cores all                                   # default, laptop CPU
    snakemake --cores all --configfile config/paper.yaml    # the paper's scale, GPU
    snakemake --report report.html                          # figures 1-4 with captions

The rules are thin: each one calls the ``attnid`` command line. The DAG is
data -> (theory, training runs) -> tables -> figures -> appendix.
"""

import shutil
import sys

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

min_version("8.0")


# The default config, unless --configfile names another: then that file alone is the
# config (snakemake would otherwise merge it into the default, so a config listing
# fewer cases or seeds would silently keep the default's).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


def validate_config_or_exit(config):
    """Validate against the schema; a bad value is ONE line on stderr, not a traceback."""
    try:
        validate(config, "workflow/schemas/config.schema.yaml")
    except WorkflowError as err:
        # snakemake wraps the jsonschema ValidationError; it is the exception's context.
        cause = err.__context__ if hasattr(err.__context__, "absolute_path") else None
        if cause is None:
            print(f"config error: {str(err).splitlines()[0]}", file=sys.stderr)
        else:
            where = "/".join(str(p) for p in cause.absolute_path) or "(top level)"
            print(f"config error: {where}: {cause.message}", file=sys.stderr)
        sys.exit(1)
    for optimizer in config["sweep"]:
        if optimizer not in config["cases"]:
            print(f"config error: sweep/{optimizer}: no case '{optimizer}' under cases to take its settings from",
                  file=sys.stderr)
            sys.exit(1)


validate_config_or_exit(config)


def want_pdf():
    """paper_pdf: auto builds the appendix PDF only where latexmk is installed."""
    setting = config.get("paper_pdf", "auto")
    return shutil.which("latexmk") is not None if setting == "auto" else bool(setting)


include: "workflow/rules/data.smk"
include: "workflow/rules/theory.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        rules.tables.output,
        rules.figures.output,
        rules.appendix.output,
    default_target: True
