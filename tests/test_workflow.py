"""The workflow's contracts with the package and with its users: the config-key -> `attnid train` flag
table against the command's own options and the schema, the case list taken from the registry (a new
case needs no other file), one `config error:` line for unwritable folders and broken YAML, and no .smk
file reading a name that another .smk file (other than common.smk) defines."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from pipeline_helpers import REPO, copy_pipeline, pipeline_config, run_snakemake, smoke_config, stderr_lines

from attnid.cli import build_parser
from attnid.reports.studies import study_points
from attnid.training import cases

SCHEMA = REPO / "workflow/schemas/config.schema.yaml"
JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}
# Keys of the run sections that are not settings of one run: the grids and the stage's own choices.
GRID_KEYS = {"lrs", "seeds", "n_heads", "matched_reference_heads", "points", "case"}


def train_parser() -> argparse.ArgumentParser:
    parser = build_parser("train")
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["train"]


def schema_run_keys() -> dict[str, dict]:
    """{key: its schema} of every key a config may set for a training run, from each section that holds
    them (model, training, cases, sweep, heads, variants and their points, edits)."""
    schema = yaml.safe_load(SCHEMA.read_text())
    defs, properties = schema["$defs"], schema["properties"]

    def resolve(spec: dict) -> dict:
        while "$ref" in spec:
            node = schema
            for part in spec["$ref"].removeprefix("#/").split("/"):
                node = node[part]
            spec = {**node, **{k: v for k, v in spec.items() if k != "$ref"}}
        return spec

    sections = [
        properties["model"]["properties"],
        properties["training"]["properties"],
        defs["run_settings"],
        defs["case"]["properties"],
        defs["sweep"]["properties"],
        properties["heads"]["properties"],
        properties["variants"]["properties"],
        properties["variants"]["properties"]["points"]["additionalProperties"]["properties"],
        properties["edits"]["properties"],
    ]
    return {
        key: resolve(spec) for section in sections for key, spec in section.items() if key not in GRID_KEYS
    }


def schema_type(spec: dict) -> str:
    if "enum" in spec:
        return "string"
    return spec["type"]


def test_every_mapped_flag_is_an_attnid_train_option_of_the_same_type():
    table = pipeline_config().TRAIN_FLAGS
    help_text = subprocess.run(
        [sys.executable, "-m", "attnid", "train", "--help"], capture_output=True, text=True, check=True
    ).stdout
    actions = {option: action for action in train_parser()._actions for option in action.option_strings}
    for key, entry in table.items():
        assert entry.flag in help_text, f"{key}: {entry.flag} is not in 'attnid train --help'"
        action = actions[entry.flag]
        if entry.kind is bool:  # --flag / --no-flag
            assert isinstance(action, argparse.BooleanOptionalAction), key
            assert f"--no-{entry.flag[2:]}" in action.option_strings, key
        else:
            assert action.type is entry.kind, (
                f"{key}: {entry.flag} takes {action.type}, the table says {entry.kind}"
            )
        assert action.dest == key, f"{key} maps to {entry.flag}, which sets {action.dest}"


def test_every_run_setting_the_schema_allows_maps_to_a_flag():
    table = pipeline_config().TRAIN_FLAGS
    keys = schema_run_keys()
    assert set(keys) - set(table) == set(), "settings without an `attnid train` flag"
    for key, spec in keys.items():
        assert schema_type(spec) == JSON_TYPES[table[key].kind], key
    # the rest of the table: the job's seed and the attention shape of a study point
    architecture = {
        key
        for points in study_points(smoke_config()).values()
        for point in points
        for key in point.architecture()
    }
    assert set(table) == set(keys) | {"seed"} | architecture, "table entries no config can set"


def test_the_training_rule_passes_only_attnid_train_options():
    shell = re.search(
        r"rule train_case:.*?shell:\n(.*?)\n\n", (REPO / "workflow/rules/train.smk").read_text(), re.DOTALL
    ).group(1)
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", shell))
    assert flags == {"--data", "--threads", "--device", "--out"}, flags
    options = {option for action in train_parser()._actions for option in action.option_strings}
    assert flags <= options


def test_run_flags_follow_the_table():
    module = pipeline_config()
    flags = module.run_flags("adamw", {"n_layer": 2, "bias": False, "rope": True, "lr": 0.001, "seed": 3})
    assert flags == "--case adamw --n-layer 2 --no-bias --rope --lr 0.001 --seed 3"
    with pytest.raises(module.ConfigError, match="'n_layers' has no `attnid train` flag"):
        module.run_flags("adamw", {"n_layers": 2})
    with pytest.raises(module.ConfigError, match="--bias takes true or false"):
        module.run_flags("adamw", {"bias": "yes"})


def test_a_setting_without_a_flag_is_a_config_error(tmp_path):
    """A key the schema allows but the table lacks stops the parse with one line, not a failed job."""
    copy_pipeline(tmp_path)
    schema_file = tmp_path / "workflow/schemas/config.schema.yaml"
    schema = yaml.safe_load(schema_file.read_text())
    schema["properties"]["model"]["properties"]["n_experts"] = {"type": "integer"}
    schema_file.write_text(yaml.safe_dump(schema, sort_keys=False))
    proc = run_snakemake(tmp_path, "-n", config={"model": {"n_experts": 2}})
    assert proc.returncode != 0
    lines = stderr_lines(proc)
    assert len(lines) == 1 and lines[0].startswith("config error: "), proc.stderr
    assert "'n_experts' has no `attnid train` flag" in lines[0] and "/runs/" in lines[0], lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr


def _enums(node) -> list[list]:
    if isinstance(node, dict):
        return ([node["enum"]] if "enum" in node else []) + [
            e for value in node.values() for e in _enums(value)
        ]
    if isinstance(node, list):
        return [e for item in node for e in _enums(item)]
    return []


def test_schema_file_lists_no_case_and_the_workflow_takes_the_registry():
    schema = yaml.safe_load(SCHEMA.read_text())
    copied = [enum for enum in _enums(schema) if set(enum) & set(cases.CASES)]
    assert not copied, f"the schema file copies case names: {copied}"  # the registry is the one list
    assert schema["$defs"]["case_name"] == {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"}
    assert pipeline_config().config_schema()["$defs"]["case_name"] == {"enum": list(cases.CASES)}


def test_a_new_case_needs_only_the_registry(tmp_path):
    """Adding a case is one register() call in src/attnid/training/cases.py: a copy of the source with
    that one change (and nothing else) runs the pipeline's plan with the case in every stage that takes
    one."""
    source = tmp_path / "src"
    shutil.copytree(REPO / "src", source, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    registry = source / "attnid/training/cases.py"
    registry.write_text(
        registry.read_text() + '\nregister(Case("sgd_nesterov", "SGD + Nesterov", "SGD, Nesterov momentum",'
        ' 0.01, sgd_momentum, color="#56B4E9"))\n'
    )
    workdir = copy_pipeline(tmp_path / "pipeline")
    new_case = {
        "cases": {"sgd_nesterov": {"lr": 0.02}},
        "sweep": {"sgd_nesterov": {"lrs": [0.01, 0.02], "seeds": [0], "max_iters": 5}},
        "edits": {"case": "sgd_nesterov", "seeds": [0]},
    }
    proc = run_snakemake(workdir, "-n", "-p", config=new_case, env={"PYTHONPATH": str(source)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for run_dir in ("runs/sgd_nesterov/seed0", "sweep/sgd_nesterov/lr0.02/seed0", "edits/sgd_nesterov/seed0"):
        assert re.search(
            rf"attnid train [^\n]*--case sgd_nesterov [^\n]*--out \S+/{run_dir} ", proc.stdout
        ), run_dir
    # the checkout's own registry does not know it: the same config is refused with one line
    proc = run_snakemake(workdir, "-n", config=new_case)
    lines = stderr_lines(proc)
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("config error: cases: 'sgd_nesterov' is not one of"), lines[0]


@pytest.mark.parametrize(
    "where, config, message",
    [
        (
            "/proc",
            {"results_dir": "/proc/attnid/results"},
            "config error: results_dir: /proc/attnid/results is not writable: "
            "cannot create a directory in /proc",
        ),
        (
            "file",
            {"results_dir": "README.md/results"},
            "config error: results_dir: README.md/results is not writable: README.md is not a directory",
        ),
        (
            "data",
            {},
            "config error: data directory: data/tinyshakespeare is not writable: data is not a directory",
        ),
    ],
)
def test_an_unwritable_output_folder_is_one_config_error(tmp_path, where, config, message):
    copy_pipeline(tmp_path)
    (tmp_path / "README.md").write_text("a file, not a folder\n")
    if where == "data":
        (tmp_path / "data").write_text("a file where the data folder goes\n")
    proc = run_snakemake(tmp_path, "-n", config=config)
    assert proc.returncode != 0
    lines = stderr_lines(proc)
    assert len(lines) == 1 and lines[0].startswith(message), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not list(tmp_path.glob(".attnid-write-check-*"))


def test_a_yaml_error_in_the_default_config_names_the_file_and_line(tmp_path):
    copy_pipeline(tmp_path)
    config_file = tmp_path / "config/config.yaml"
    lines = config_file.read_text().splitlines()
    broken = next(n for n, line in enumerate(lines) if line.startswith("model:")) + 2
    lines.insert(broken - 1, "  n_layer: [4")  # an unclosed flow sequence on line `broken`
    config_file.write_text("\n".join(lines) + "\n")
    proc = run_snakemake(tmp_path, "-n", configfile=None)
    assert proc.returncode != 0
    err = stderr_lines(proc)
    assert len(err) == 1, proc.stderr
    assert re.match(
        rf"config error: config/config.yaml, line {broken + 1}, column \d+: .*\(not valid YAML\)$", err[0]
    ), err[0]
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_yaml_error_in_a_configfile_stops_snakemake_without_a_traceback(tmp_path):
    """Snakemake (9.27) reads a --configfile while parsing its arguments, before the Snakefile runs, and
    reports a YAML error there without the file or the line: the workflow cannot name them (see
    docs/experiments.md). What it can be held to: the run stops before any job, with no traceback."""
    copy_pipeline(tmp_path)
    (tmp_path / "config/mine.yaml").write_text("results_dir: results/mine\nmodel: {n_layer: 4\nseeds: [0]\n")
    proc = run_snakemake(tmp_path, "-n", configfile="config/mine.yaml")
    assert proc.returncode != 0
    assert "not valid JSON or YAML" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists()


def _top_level_names(text: str) -> set[str]:
    """Names a .smk file defines at its top level: assignments, functions, classes, imports."""
    names = set(re.findall(r"^([A-Za-z_]\w*)\s*=(?!=)", text, re.MULTILINE))
    names |= set(re.findall(r"^(?:def|class)\s+(\w+)", text, re.MULTILINE))
    for imported in re.findall(r"^from\s+\S+\s+import\s+(\([^)]*\)|[^\n]*)", text, re.MULTILINE):
        names |= set(re.findall(r"\w+", imported.strip("()")))
    return names


def _code(text: str) -> str:
    """``text`` without its comment lines and trailing comments (good enough for the rule files)."""
    return "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in text.splitlines())


def test_names_shared_between_rule_files_live_in_common_smk():
    """Every .smk file uses only its own names and common.smk's, so that what a rule reads is found in
    two places at most (the rule's file and common.smk)."""
    files = {
        path.name: path.read_text() for path in [REPO / "Snakefile", *(REPO / "workflow/rules").glob("*.smk")]
    }
    assert "common.smk" in files
    offenders = []
    for owner, text in files.items():
        if owner == "common.smk":
            continue
        for name in _top_level_names(text):
            users = [
                other
                for other, code in files.items()
                if other != owner and re.search(rf"\b{name}\b", _code(code))
            ]
            offenders += [f"{name} (defined in {owner}) is used in {user}" for user in users]
    assert not offenders, offenders
