"""The workflow's contracts with the package and with its users: the pipeline config's schema generated
from TrainConfig (a new setting is one field), each training job reading its spec file (written by a job
of its own, again only when its settings change; a parse or a dry run writes nothing), the case list
taken from the registry (a new case needs no other file), one `config error:` line for unwritable folders,
a results_dir over the checkout or in a system folder, broken or exploding YAML, the workflow importing
only attnid.plan, and no .smk file reading a name that another .smk file (other than common.smk)
defines."""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml
from pipeline_helpers import (
    PIPELINE_FILES,
    REPO,
    copy_pipeline,
    run_snakemake,
    smoke_config,
    stderr_lines,
    train_jobs,
)

from attnid.cli import build_parser
from attnid.cli.train import add_train_arguments, config_from_args
from attnid.plan import plan, spec_texts
from attnid.plan.runs import spec_text
from attnid.plan.schema import JOB_OPTIONS, config_schema, option_schema, section_settings
from attnid.training import cases
from attnid.training.config import option_names, resolve_config

SCHEMA_FILE = REPO / "src/attnid/plan/config.schema.yaml"
# What copy_pipeline puts in a work directory, by its top-level names.
PIPELINE_TOP_LEVEL = sorted({name.split("/")[0] for name in PIPELINE_FILES})


def train_parser() -> argparse.ArgumentParser:
    parser = build_parser("train")
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["train"]


def _run_setting_objects(node, found):
    """Every object schema of the completed schema that holds run settings (its properties)."""
    if isinstance(node, dict):
        if "properties" in node and set(node["properties"]) & set(option_names()):
            found.append(node["properties"])
        for value in node.values():
            _run_setting_objects(value, found)
    elif isinstance(node, list):
        for item in node:
            _run_setting_objects(item, found)
    return found


def test_every_run_setting_of_the_schema_is_a_train_option_typed_and_bounded_as_its_field():
    settings = {
        key: spec
        for properties in _run_setting_objects(config_schema(), [])
        for key, spec in properties.items()
        if key in option_names() and key != "case"  # a case is a name of the registry ($defs/case_name)
    }
    assert {"lr", "max_iters", "n_layer", "rebalance_moments", "dtype", "n_kv_head", "rope", "bias"} <= set(
        settings
    )
    for key, spec in settings.items():
        generated = option_schema(key)
        assert {k: spec[k] for k in generated if k != "description"} == {
            k: v for k, v in generated.items() if k != "description"
        }, key
    # spot checks against what the fields say
    assert settings["lr"]["exclusiveMinimum"] == 0 and settings["lr"]["type"] == "number"
    assert settings["max_iters"] == settings["max_iters"] | {"type": "integer", "minimum": 1}
    assert settings["dropout"]["exclusiveMaximum"] == 1 and settings["warmup_iters"]["minimum"] == 0
    assert config_schema()["$defs"]["seeds"]["items"]["maximum"] == 2**63 - 1  # attnid.common.limits


def test_the_schema_file_declares_no_setting_of_a_run():
    """config.schema.yaml gives a run setting at most a default or a description of its own: its type,
    bounds and values are TrainConfig's (declared once)."""
    text = SCHEMA_FILE.read_text()

    def walk(node):
        if isinstance(node, dict):
            for key, value in (node.get("properties") or {}).items():
                if key in option_names() and key != "case":
                    assert set(value) <= {"default", "description", "x-train-option"}, (key, value)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(yaml.safe_load(text))
    assert "x-run-settings" not in str(config_schema()) and "x-train-option" not in str(config_schema())
    # no section sets a job option (the workflow gives those per job)
    for name, settings in section_settings().items():
        assert not set(settings) & set(JOB_OPTIONS), name


def test_the_training_rule_passes_only_attnid_train_options():
    shell = re.search(
        r"rule train_case:.*?shell:\n(.*?)\n\n", (REPO / "workflow/rules/train.smk").read_text(), re.DOTALL
    ).group(1)
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", shell))
    assert flags == {"--config", "--data", "--threads", "--device", "--out", "--restart-if-changed"}, flags
    options = {option for action in train_parser()._actions for option in action.option_strings}
    assert flags <= options


def test_a_spec_file_reads_back_as_the_run_its_plan_checked(tmp_path):
    """`attnid train --config SPEC` resolves to exactly the settings the plan checked with resolve_config:
    types, booleans and floats survive the YAML round trip."""
    planned = plan(smoke_config())
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    for run_dir, spec in planned.trained().items():
        path = tmp_path / "spec.yaml"
        path.write_text(spec_text(spec, str(path), run_dir))
        args = parser.parse_args(["--config", str(path), "--data", "d", "--out", run_dir])
        expected = resolve_config({**spec.options(), "data": "d", "out": run_dir})
        assert asdict(config_from_args(args)) == asdict(expected), run_dir


def test_a_new_setting_is_one_field_and_the_schema_plan_and_spec_follow(tmp_path):
    """A copy of the source with one more TrainConfig field (and nothing else): the config may set it in
    the training section, a bad value is a config error naming the key, and the spec files carry it."""
    source = tmp_path / "src"
    shutil.copytree(REPO / "src", source, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    module = source / "attnid/training/config.py"
    text = module.read_text()
    anchor = "    rebalance_every: int = option("
    assert anchor in text
    module.write_text(
        text.replace(
            anchor,
            '    label_smoothing: float = option(0.0, "label smoothing (default 0)", bound="non_negative",'
            " below=1)\n" + anchor,
            1,
        )
    )
    workdir = copy_pipeline(tmp_path / "pipeline")
    env = {"PYTHONPATH": str(source)}
    proc = run_snakemake(workdir, "-n", "-p", config={"training": {"label_smoothing": 0.1}}, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = train_jobs(workdir, proc.stdout)
    assert jobs and all(job["label_smoothing"] == 0.1 for job in jobs.values())
    # its bounds are the field's, one line naming the key
    proc = run_snakemake(workdir, "-n", config={"cases": {"sgd": {"label_smoothing": 1.5}}}, env=env)
    lines = stderr_lines(proc)
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert (
        lines[0]
        == "config error: cases/sgd/label_smoothing: 1.5 is greater than or equal to the maximum of 1"
    )
    # the checkout's own TrainConfig has no such field: the same key is refused
    proc = run_snakemake(workdir, "-n", config={"training": {"label_smoothing": 0.1}})
    lines = stderr_lines(proc)
    assert proc.returncode != 0 and "'label_smoothing' was unexpected" in lines[0], proc.stderr


def _files(root: Path) -> dict[str, tuple[int, int]]:
    """{path: (size, mtime_ns)} of every file under ``root`` but Snakemake's own records (.snakemake/)."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file() and ".snakemake" not in p.relative_to(root).parts
    }


def test_spec_files_are_written_by_their_jobs_again_only_when_their_settings_change(tmp_path):
    """Each spec file is a job's output, its text the job's parameter: built once, an unchanged config has
    nothing to do; a changed setting reruns exactly the spec jobs of the runs it changes (Snakemake's params
    trigger), which rewrite exactly those files; a dry run of the change writes nothing."""
    workdir = copy_pipeline(tmp_path)
    texts = spec_texts(plan(smoke_config()))
    assert len(texts) == len(plan(smoke_config()).trained())
    targets = [*texts, "--configfile", "config/smoke.yaml"]  # targets before --configfile's list
    proc = run_snakemake(workdir, *targets, configfile=None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {path: (workdir / path).read_text() for path in texts} == texts
    old = time.time() - 3600
    for path in texts:
        os.utime(workdir / path, (old, old))
    proc = run_snakemake(workdir, "-n", *targets, configfile=None)
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]
    # one case's setting changes: its runs' spec jobs rerun, and no other; the dry run writes nothing
    change = {"cases": {"sgd_wd": {"weight_decay": 0.2}}}
    before = _files(workdir)
    proc = run_snakemake(workdir, "-n", *targets, configfile=None, config=change)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rerun = re.findall(
        r"rule spec_file:\n    output: (\S+)\n(?:    (?!reason).*\n)*    reason: (.*)", proc.stdout
    )
    expected = {f"results/smoke/specs/runs/sgd_wd/seed{seed}.yaml" for seed in smoke_config()["seeds"]}
    assert {path for path, _ in rerun} == expected, proc.stdout[-3000:]
    assert all(reason.startswith("Params have changed since last execution") for _, reason in rerun), rerun
    assert _files(workdir) == before, "the dry run wrote"
    proc = run_snakemake(workdir, *targets, configfile=None, config=change)
    assert proc.returncode == 0, proc.stderr[-3000:]
    changed = {path for path in texts if (workdir / path).stat().st_mtime > old + 1}
    assert changed == expected, changed
    assert "weight_decay: 0.2" in (workdir / "results/smoke/specs/runs/sgd_wd/seed0.yaml").read_text()
    assert not [p for p in (workdir / "results/smoke/specs").rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"cases": {"adamw": {"lr": 0.002}}, "seeds": [0, 1]},  # another build's settings
        {"results_dir": "{scratch}/results"},  # outside the checkout (a cluster's scratch space)
        {"interventions": "null", "heads": "null", "variants": "null", "edits": "null", "paper_pdf": False},
    ],
    ids=["smoke", "other-settings", "scratch-results-dir", "no-stages"],
)
def test_parsing_the_workflow_and_a_dry_run_write_nothing(tmp_path, config):
    """A dry run (which parses the workflow as every snakemake does) writes nothing but Snakemake's own
    records: no spec file, no folder (not even to see whether one can be made), wherever results_dir is;
    so a second snakemake, whatever its config, never changes a running build's inputs."""
    workdir = copy_pipeline(tmp_path / "checkout")
    scratch = tmp_path / "scratch"
    config = {
        key: value.format(scratch=scratch) if isinstance(value, str) else value
        for key, value in config.items()
    }
    before = _files(workdir)
    proc = run_snakemake(workdir, "-n", "-p", config=config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "attnid train --config" in proc.stdout and "spec_file" in proc.stdout
    assert _files(workdir) == before
    assert sorted(p.name for p in workdir.iterdir()) == sorted([*PIPELINE_TOP_LEVEL, ".snakemake"])
    assert not scratch.exists() and not list(tmp_path.glob(".attnid-*"))


@pytest.mark.parametrize(
    "results_dir",
    ["/", ".", "..", "results/..", "{workdir}"],
)
def test_a_results_dir_over_the_checkout_is_one_config_error(tmp_path, results_dir):
    workdir = copy_pipeline(tmp_path / "checkout")
    proc = run_snakemake(workdir, "-n", config={"results_dir": results_dir.format(workdir=workdir)})
    lines = stderr_lines(proc)
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("config error: results_dir: "), lines[0]
    assert "root folder" in lines[0] or "the checkout" in lines[0], lines[0]
    assert not (workdir / "specs").exists() and not (tmp_path / "specs").exists()


@pytest.mark.parametrize(
    "setting, message",
    [
        ("sweep={sgd: {lrs: [1.0e-4, .nan]}}", "config error: sweep/sgd/lrs/1: nan is not a finite number"),
        (
            "sweep={adamw: {lrs: [1.0e-4, .inf]}}",
            "config error: sweep/adamw/lrs/1: inf is not a finite number",
        ),
        (
            "seeds=[0, 9223372036854775808]",
            "config error: seeds/1: 9223372036854775808 is greater than the maximum of 9223372036854775807",
        ),
        ("seeds=[-1]", "config error: seeds/0: -1 is less than the minimum of 0"),
    ],
)
def test_nonsense_values_are_one_config_error_naming_the_key(tmp_path, setting, message):
    copy_pipeline(tmp_path)
    key, value = setting.split("=", 1)
    proc = run_snakemake(tmp_path, "-n", config={key: value})
    lines = stderr_lines(proc)
    assert proc.returncode != 0 and lines == [message], proc.stderr
    # the same value in a config file
    config = smoke_config()
    config[key] = config.get(key) or {}
    override = yaml.safe_load(value)
    if isinstance(override, dict):
        for name, section in override.items():
            config[key][name] = {**config[key].get(name, {}), **section}
    else:
        config[key] = override
    (tmp_path / "config/mine.yaml").write_text(yaml.safe_dump(config))
    proc = run_snakemake(tmp_path, "-n", configfile="config/mine.yaml")
    lines = stderr_lines(proc)
    assert proc.returncode != 0 and lines == [message], proc.stderr


def _alias_bomb(depth: int) -> str:
    items = ['&a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    items += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, depth + 1)]
    return "[" + ", ".join(items) + "]"


@pytest.mark.parametrize("where", ["configfile", "default"])
def test_a_yaml_alias_bomb_is_one_short_line(tmp_path, where):
    """A "billion laughs" config (9^9 values through 9 aliases) is refused by its size, in one short line,
    before anything quotes it."""
    copy_pipeline(tmp_path)
    text = (
        (REPO / "config/smoke.yaml")
        .read_text()
        .replace("results_dir: results/smoke", "results_dir: " + _alias_bomb(8))
    )
    target = "config/bomb.yaml" if where == "configfile" else "config/config.yaml"
    (tmp_path / target).write_text(text)
    proc = run_snakemake(
        tmp_path, "-n", configfile="config/bomb.yaml" if where == "configfile" else None, timeout=120
    )
    lines = stderr_lines(proc)
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr[:2000]
    assert lines[0].startswith("config error: (top level): holds more than 100000 values"), lines[0]
    assert len(proc.stderr) < 1000
    # a smaller one that fits the budget is still one line of bounded length (the schema's message is cut)
    (tmp_path / target).write_text(text.replace(_alias_bomb(8), _alias_bomb(3)))
    proc = run_snakemake(tmp_path, "-n", configfile="config/bomb.yaml" if where == "configfile" else None)
    lines = stderr_lines(proc)
    assert proc.returncode != 0 and len(lines) == 1 and len(lines[0]) <= 320, proc.stderr[:2000]
    assert lines[0].startswith("config error: results_dir: "), lines[0]


def _imports(text: str) -> dict[str, set[str]]:
    """{module: names} of the Python import statements in ``text`` (a .smk file is Python with rules)."""
    found: dict[str, set[str]] = {}
    for line in re.findall(r"^(?:from\s+\S+\s+import\s+(?:\([^)]*\)|[^\n]*)|import\s+[^\n]*)", text, re.M):
        node = ast.parse(line).body[0]
        if isinstance(node, ast.ImportFrom):
            found.setdefault(node.module or "", set()).update(alias.name for alias in node.names)
        else:
            for alias in node.names:
                found.setdefault(alias.name, set())
    return found


# What the workflow may import of the package: the plan's public names; the figures' registry (what each
# figure reads, for the one `figure` rule) and the report's table pages (which tables have a page).
# Everything else it knows of a run comes from the plan.
WORKFLOW_SURFACE = {
    "attnid.plan": set(__import__("attnid.plan").plan.__all__),
    "attnid.reports.figures": {"registry"},
    "attnid.reports.report_pages": {"TABLE_PAGES", "table_pages"},
    # the counts' input: the published shapes, package data (docs/design.md §6)
    "attnid.theory.architectures": {"PACKAGED_ARCHITECTURES"},
}


def test_the_workflow_imports_only_the_plan():
    imported: dict[str, set[str]] = {}
    for path in [REPO / "Snakefile", *(REPO / "workflow").rglob("*.smk"), *(REPO / "workflow").rglob("*.py")]:
        for module, names in _imports(path.read_text()).items():
            imported.setdefault(module, set()).update(names)
    package = {module: names for module, names in imported.items() if module.split(".")[0] == "attnid"}
    assert set(package) <= set(WORKFLOW_SURFACE), package
    for module, names in package.items():
        assert names <= WORKFLOW_SURFACE[module], (module, names - WORKFLOW_SURFACE[module])
    assert "attnid.plan" in package
    others = {module.split(".")[0] for module in imported} - {"attnid"}
    # threading: onsuccess/onerror end Snakemake's own re-evaluation timers (docs/cluster.md)
    assert others <= {"os", "re", "shlex", "shutil", "sys", "threading", "snakemake"}, others


# What parsing the workflow must not load: a cluster job parses it twice (the SLURM job step, then the srun
# step that runs the job), and each of these would add a second or two of CPU to every parse.
HEAVY_AT_PARSE = {"torch", "scipy.stats", "matplotlib"}


def test_parsing_the_workflow_loads_no_heavy_library(tmp_path):
    """A dry run with Python's import log on (PYTHONPROFILEIMPORTTIME): every module the parse loads."""
    proc = run_snakemake(copy_pipeline(tmp_path), "-n", env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = {
        line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")
    }
    assert {"snakemake", "attnid.plan"} <= loaded  # the log is there
    assert not loaded & HEAVY_AT_PARSE, sorted(loaded & HEAVY_AT_PARSE)


def _enums(node) -> list[list]:
    if isinstance(node, dict):
        return ([node["enum"]] if "enum" in node else []) + [
            e for value in node.values() for e in _enums(value)
        ]
    if isinstance(node, list):
        return [e for item in node for e in _enums(item)]
    return []


def test_schema_file_lists_no_case_and_the_plan_takes_the_registry():
    schema = yaml.safe_load(SCHEMA_FILE.read_text())
    copied = [enum for enum in _enums(schema) if set(enum) & set(cases.CASES)]
    assert not copied, f"the schema file copies case names: {copied}"  # the registry is the one list
    assert schema["$defs"]["case_name"] == {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"}
    assert config_schema()["$defs"]["case_name"] == {"enum": list(cases.CASES)}


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
        "sweep": {"sgd_nesterov": {"lrs": [0.01, 0.02], "seeds": [0], "max_iters": 5, "warmup_iters": 1}},
        "edits": {"case": "sgd_nesterov", "seeds": [0]},
    }
    proc = run_snakemake(workdir, "-n", "-p", config=new_case, env={"PYTHONPATH": str(source)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = train_jobs(workdir, proc.stdout)
    for run_dir in ("runs/sgd_nesterov/seed0", "sweep/sgd_nesterov/lr0.02/seed0", "edits/sgd_nesterov/seed0"):
        assert jobs[f"results/smoke/{run_dir}"]["case"] == "sgd_nesterov", run_dir
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
            "config error: results_dir: /proc/attnid/results is inside the system folder /proc",
        ),
        (
            "/etc",
            {"results_dir": "/etc"},
            "config error: results_dir: /etc is inside the system folder /etc",
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
    before = _files(tmp_path)
    proc = run_snakemake(tmp_path, "-n", config=config)
    assert proc.returncode != 0
    lines = stderr_lines(proc)
    assert len(lines) == 1 and lines[0].startswith(message), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert _files(tmp_path) == before and not list(tmp_path.glob(".attnid-*"))


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
