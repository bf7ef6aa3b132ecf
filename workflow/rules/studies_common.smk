# The run lists and flags of the identification studies (studies.smk), in common.smk's style: the
# points come from attnid.studies, so the rules, the tests and `attnid studies` share one plan.

from attnid.studies import (
    STUDY_CASE,
    check_study_config,
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
STUDY_OUTPUTS = [
    f"{run_dir}/{name}"
    for run_dirs in STUDY_RUN_DIRS.values()
    for run_dir in run_dirs
    for name in ("metrics.csv", "run.json")
]
STUDY_TABLE_FILES = [
    f"{TABLES_DIR}/{name}"
    for name in [
        "heads.csv",
        "heads.tex",
        "variants.csv",
        "variants.tex",
        "identification_correlation.csv",
    ]
]


def study_flags(wildcards):
    point = STUDY_POINTS[wildcards.study][wildcards.point]
    settings = run_settings(
        STUDY_CASE,
        **study_run_settings(config[wildcards.study]),
        **point.architecture(),
        seed=int(wildcards.seed),
    )
    return train_flags(STUDY_CASE, settings)
