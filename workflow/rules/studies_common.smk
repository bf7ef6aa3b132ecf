# The run lists and flags of the identification studies (studies.smk), in common.smk's style: the
# points come from attnid.reports.studies, so the rules, the tests and `attnid studies` share one plan.

from attnid.reports.studies import (
    STUDY_CASE,
    check_study_config,
    reused_points,
    study_points,
    study_run_settings,
)

for problem in check_study_config(config):
    config_error(problem)

# {study: {point name: StudyPoint}}, in the config's order.
STUDY_POINTS = {
    study: {point.name: point for point in points}
    for study, points in study_points(config).items()
}
# Only the runs this config asks for are gathered, never leftovers of an older config.
STUDY_RUN_DIRS = {
    study: [
        f"{RESULTS}/studies/{study}/{name}/seed{seed}"
        for name in points
        for seed in config[study]["seeds"]
    ]
    for study, points in STUDY_POINTS.items()
}
# "<study>/<point>" -> "<study>/<point>" of the earlier point that trains the same model with the same
# settings (e.g. variants/mha -> heads/h4): its runs are copied, not trained again.
REUSED_STUDY_RUNS = {
    f"{study}/{point}": f"{source_study}/{source_point}"
    for (study, point), (source_study, source_point) in reused_points(config).items()
}
STUDY_OUTPUTS = [
    f"{run_dir}/{name}"
    for run_dirs in STUDY_RUN_DIRS.values()
    for run_dir in run_dirs
    for name in ("metrics.csv", "run.json")
]
# A config without study sections (heads: null, variants: null) has no study jobs and no Figure 5.
STUDY_TABLE_FILES = (
    [f"{TABLES_DIR}/{study}.{ext}" for study in STUDY_POINTS for ext in ("csv", "tex")]
    + [f"{TABLES_DIR}/identification_correlation.{ext}" for ext in ("csv", "tex")]
    if STUDY_POINTS
    else []
)


def study_flags(wildcards):
    point = STUDY_POINTS[wildcards.study][wildcards.point]
    settings = run_settings(
        STUDY_CASE,
        **study_run_settings(config[wildcards.study]),
        **point.architecture(),
        seed=int(wildcards.seed),
    )
    return train_flags(STUDY_CASE, settings)


def reused_run_file(wildcards, name):
    source = REUSED_STUDY_RUNS[wildcards.reused]
    return f"{RESULTS}/studies/{source}/seed{wildcards.seed}/{name}"
