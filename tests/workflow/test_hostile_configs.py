"""Hostile pipeline configs (docs/experiments.md, "The config"): every `--config` value and config file
that is no config of this pipeline ends before any job starts, in one `config error:` line that names the
key, and writes nothing: not in the checkout, not where its results_dir points, not a file that a YAML
tag asks for. The run is a real one (not a dry run), so a config that got through would start jobs."""

from __future__ import annotations

import os

import pytest
from pipeline_helpers import copy_pipeline, run_snakemake, smoke_config, stderr_lines

from attnid.plan import ConfigError
from attnid.plan.config import check_results_dir, unwritable

SYSTEM_RESULTS = "/etc/attnid-hostile-config-test/results"
# the file a YAML tag that ran code would make
MADE_BY_CODE = "made-by-a-yaml-tag"

# (--config values, the whole `config error:` line or its start)
HOSTILE_VALUES = {
    "duplicate-seeds": ({"seeds": "[1, 1]"}, "config error: seeds: [1, 1] has non-unique elements"),
    "negative-seed": ({"seeds": "[-3]"}, "config error: seeds/0: -3 is less than the minimum of 0"),
    "nan-lr": ({"cases": "{adamw: {lr: .nan}}"}, "config error: cases/adamw/lr: nan is not a finite number"),
    "inf-lr": ({"cases": "{sgd: {lr: .inf}}"}, "config error: cases/sgd/lr: inf is not a finite number"),
    "huge-max-iters": (
        {"training": "{max_iters: 1e12}"},
        "config error: training/max_iters: 1000000000000.0 is greater than the maximum of 10000000",
    ),
    "negative-max-iters": (
        {"training": "{max_iters: -5}"},
        "config error: training/max_iters: -5 is less than the minimum of 1",
    ),
    "too-many-rows": (
        {"training": "{max_iters: 5000000, log_every: 1}"},
        "config error: cases/sgd: --max-iters 5000000 at --log-every 1 is 5,000,000 rows of metrics.csv, "
        "more than 1,000,000",
    ),
    "huge-width": (
        {"model": "{n_embd: 1000000000}"},
        "config error: model/n_embd: 1000000000 is greater than the maximum of 65536",
    ),
    "wrong-type": (
        {"model": "{n_layer: two}"},
        "config error: model/n_layer: 'two' is not of type 'integer'",
    ),
    "wrong-type-top-level": ({"threads": "[1]"}, "config error: threads: [1] is not of type 'integer'"),
    "unknown-key": (
        {"trainig": "{max_iters: 5}"},
        "config error: (top level): Additional properties are not allowed ('trainig' was unexpected)",
    ),
    "unknown-nested-key": (
        {"model": "{n_layers: 2}"},
        "config error: model: Additional properties are not allowed ('n_layers' was unexpected)",
    ),
    "shape-does-not-divide": (
        {"model": "{n_head: 3}", "heads": "null", "variants": "null"},
        "config error: cases/sgd: --n-embd 32 is not a multiple of --n-head 3",
    ),
    "calibration-seed-compared": (
        {
            "interventions": "{calibration: {arms: [adamw_gauge_fixed], lr_factors: [1, 2], seeds: [100], "
            "refine: {top: 1, seeds: [0]}}}"
        },
        "config error: interventions/calibration/refine/seeds: seed(s) 0 are also comparison seeds: the lr "
        "is chosen on seeds of its own",
    ),
    "system-folder": (
        {"results_dir": SYSTEM_RESULTS},
        f"config error: results_dir: {SYSTEM_RESULTS} is inside the system folder /etc",
    ),
    "python-tag": (
        {"results_dir": f'!!python/object/apply:os.system ["touch {MADE_BY_CODE}"]'},
        "config error: results_dir: ",
    ),
}


def _files(root):
    return sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if ".snakemake" not in p.relative_to(root).parts
    )


def _refused(workdir, proc, line: str) -> None:
    """One line that starts with ``line``, no job run, no file written, no code run."""
    lines = stderr_lines(proc)
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(line), lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (workdir / "results").exists() and not (workdir / "data").exists()
    assert not (workdir / MADE_BY_CODE).exists()


@pytest.mark.parametrize("name", HOSTILE_VALUES)
def test_a_hostile_config_value_is_one_line_before_any_job(name, tmp_path, shakespeare_url):
    workdir = copy_pipeline(tmp_path / "checkout")
    before = _files(workdir)
    values, line = HOSTILE_VALUES[name]
    proc = run_snakemake(workdir, config={"data_url": shakespeare_url, **values}, timeout=120)
    _refused(workdir, proc, line)
    assert _files(workdir) == before
    assert not (tmp_path / "specs").exists()
    assert not os.path.lexists(os.path.dirname(SYSTEM_RESULTS))


# a YAML "billion laughs": g holds 10^7 values through six aliases of aliases
ALIASES = list(zip("abcdef", "bcdefg", strict=True))
# (the config file's text, our line where it is config/config.yaml)
HOSTILE_FILES = {
    "empty": ("", "config error: config/config.yaml: is empty;"),
    "a-list": ("- results_dir\n- seeds\n", "config error: config/config.yaml: holds a list;"),
    "python-tag": (
        f'results_dir: !!python/object/apply:os.system ["touch {MADE_BY_CODE}"]\n',
        "config error: config/config.yaml, line 1, column 14: could not determine a constructor for the tag "
        "'tag:yaml.org,2002:python/object/apply:os.system' (not valid YAML)",
    ),
    "alias-bomb": (
        'a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]\n'
        + "".join(
            f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdef", "bcdefg", strict=True)
        )
        + "results_dir: results/bomb\n",
        "config error: (top level): holds more than 100000 values",
    ),
}


@pytest.mark.parametrize("name", HOSTILE_FILES)
def test_a_hostile_default_config_is_one_line_naming_the_file(name, tmp_path):
    """config/config.yaml itself hostile (no --configfile): our one line, which names the file."""
    workdir = copy_pipeline(tmp_path / "checkout")
    text, line = HOSTILE_FILES[name]
    (workdir / "config/config.yaml").write_text(text)
    before = _files(workdir)
    proc = run_snakemake(workdir, configfile=None, timeout=120)
    _refused(workdir, proc, line)
    assert _files(workdir) == before


@pytest.mark.parametrize("name", ["empty", "a-list", "python-tag"])
def test_a_hostile_configfile_stops_snakemake_before_the_workflow_reads_it(name, tmp_path):
    """Snakemake (9.27) reads a --configfile itself, before the workflow runs, and refuses these files
    with its own message (no file, key or line: docs/experiments.md): no traceback, no job, no code run,
    nothing written. An alias bomb passes Snakemake and is ours (the default's line above, and
    tests/workflow/test_workflow.py)."""
    workdir = copy_pipeline(tmp_path / "checkout")
    (workdir / "config/hostile.yaml").write_text(HOSTILE_FILES[name][0])
    before = _files(workdir)
    proc = run_snakemake(workdir, configfile="config/hostile.yaml", timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "WorkflowError:\nConfig file" in proc.stderr, proc.stderr[-3000:]
    assert _files(workdir) == before and not (workdir / MADE_BY_CODE).exists()


def test_a_results_dir_outside_the_checkout_is_no_system_folder(tmp_path):
    """A cluster's scratch space is fine: the smoke config planned into a folder beside the checkout."""
    workdir = copy_pipeline(tmp_path / "checkout")
    proc = run_snakemake(workdir, "-n", config={"results_dir": str(tmp_path / "scratch" / "smoke")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{tmp_path}/scratch/smoke/runs/sgd/seed{smoke_config()['seeds'][0]}" in proc.stdout
    assert not (tmp_path / "scratch").exists()  # a dry run writes nothing


def test_whether_a_folder_can_be_written_is_read_without_writing(tmp_path, monkeypatch):
    """The parse's check of results_dir and data/ (attnid.plan.config.unwritable) reads permissions and the
    mount and makes nothing, not even a folder it removes again: a read-only mount, a folder this user may
    not write, a file on the way are each one reason; a folder that may be written is none."""
    folder = tmp_path / "results"
    folder.mkdir()
    (tmp_path / "file").write_text("a file, not a folder\n")
    before = sorted(tmp_path.rglob("*"))
    assert unwritable(folder / "smoke" / "runs") is None
    assert unwritable(tmp_path / "file" / "smoke") == f"{tmp_path / 'file'} is not a directory"

    class ReadOnly:
        f_flag = os.ST_RDONLY

    with monkeypatch.context() as patched:
        patched.setattr(os, "statvfs", lambda path: ReadOnly())
        assert (
            unwritable(folder / "smoke") == f"cannot create a directory in {folder} (read-only file system)"
        )
    with monkeypatch.context() as patched:
        patched.setattr(os, "access", lambda path, mode: False)
        assert unwritable(folder / "smoke") == f"cannot create a directory in {folder} (permission denied)"
    assert sorted(tmp_path.rglob("*")) == before
    with pytest.raises(ConfigError, match="results_dir: a folder name in it is over 255 bytes: x{40}[.]{3}$"):
        check_results_dir(str(tmp_path / ("x" * 256)), None)
