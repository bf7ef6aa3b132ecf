"""Reading and checking a pipeline config (config/*.yaml and ``--config`` overrides), in one place.

:func:`read_config` merges the command line's overrides into the config, refuses what would flood or hang
(a YAML alias bomb: :data:`MAX_CONFIG_VALUES`), non-finite numbers, anything the schema
(:mod:`attnid.plan.schema`) rejects, the cross-key rules the schema cannot say, and a ``results_dir``
that would hold the checkout or lies in a system folder. Every problem is one
:class:`~attnid.plan.errors.ConfigError`: ``<key>: <problem>``. Nothing here writes a file or a folder:
the workflow is parsed by every snakemake, a dry run included (docs/design.md §6).
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml

from attnid.plan.alignment import check_alignment_config
from attnid.plan.errors import ConfigError
from attnid.plan.interventions import check_interventions_config
from attnid.plan.quantization import check_quantization_config
from attnid.plan.schema import validate_config
from attnid.plan.studies import check_study_config

# A number as YAML 1.2 reads it (PyYAML's YAML 1.1 would keep "1e-3" a string).
NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
INTEGER = re.compile(r"[-+]?\d+")
BOOLEANS = {"true": True, "false": False}
NULLS = ("null", "~")
# YAML's spellings of the non-finite floats (read so that they are refused by name, not by type).
NON_FINITE = {".nan": math.nan, ".inf": math.inf, "+.inf": math.inf, "-.inf": -math.inf}
# The optional stages: a section set to null (--config edits=null) is off.
OPTIONAL_SECTIONS = ("heads", "variants", "edits", "interventions", "quantization", "alignment")
# The most values (mapping entries and list items, each alias counted as often as it is used) a config
# may hold. The paper's config holds about 200; a YAML "billion laughs" holds 9^9 through a few aliases,
# which would take minutes to check and floods the terminal once any message quotes it.
MAX_CONFIG_VALUES = 100_000


def typed_value(value: Any) -> Any:
    """One --config value with YAML types: numbers, true/false and null; any other text stays text.

    Snakemake reads nested --config values (``cases={sgd: {lr: 0.1}}``) with YAML's
    BaseLoader, which keeps every leaf a string, and top-level ones only as Python
    int/float/True/False: without this, ``lr: 0.1`` or ``paper_pdf=true`` fail validation.
    """
    if isinstance(value, dict):
        return {key: typed_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [typed_value(item) for item in value]
    if not isinstance(value, str):
        return value
    if INTEGER.fullmatch(value):
        return int(value)
    if NUMBER.fullmatch(value):
        return float(value)
    if value.lower() in NON_FINITE:
        return NON_FINITE[value.lower()]
    if value.lower() in BOOLEANS:
        return BOOLEANS[value.lower()]
    return None if value in NULLS else value


def merge(config: dict, overrides: dict) -> None:
    """``overrides`` merged into ``config`` in place: nested mappings key by key, anything else (lists,
    scalars) replaces (as snakemake.utils.update_config)."""
    for key, value in overrides.items():
        if isinstance(value, dict):
            inner = config.get(key)
            config[key] = inner if isinstance(inner, dict) else {}
            merge(config[key], value)
        else:
            config[key] = value


def check_size(value: Any, where: str) -> None:
    """Refuse a value that holds more than :data:`MAX_CONFIG_VALUES` values, counting each use of a YAML
    alias (so the count stops early on a structure that would expand without end)."""
    budget = MAX_CONFIG_VALUES
    stack = [value]
    while stack:
        node = stack.pop()
        items = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        for item in items:
            budget -= 1
            if budget < 0:
                raise ConfigError(
                    where,
                    f"holds more than {MAX_CONFIG_VALUES} values (YAML aliases repeating a value?); "
                    f"a pipeline config holds a few hundred",
                )
            stack.append(item)


def _non_finite(node: Any, path: tuple) -> tuple[tuple, float] | None:
    if isinstance(node, float) and not math.isfinite(node):
        return path, node
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, item in items:
        found = _non_finite(item, (*path, key))
        if found:
            return found
    return None


def check_finite(config: dict) -> None:
    """No number of a config is NaN or infinite (JSON schema's bounds let NaN through)."""
    found = _non_finite(config, ())
    if found:
        path, value = found
        raise ConfigError("/".join(map(str, path)), f"{value} is not a finite number")


def check_cross_keys(config: dict) -> None:
    """The rules between keys that the schema cannot say: each sweep and the edits name a configured case,
    the studies' shapes (attnid.plan.studies), the interventions' arms (attnid.plan.interventions)."""
    for optimizer in config["sweep"]:
        if optimizer not in config["cases"]:
            raise ConfigError(
                f"sweep/{optimizer}", f"no case '{optimizer}' under cases to take its settings from"
            )
    edits = config.get("edits")
    if edits is not None and edits["case"] not in config["cases"]:
        raise ConfigError("edits/case", f"no case '{edits['case']}' under cases to take its settings from")
    found = (
        check_study_config(config)
        + check_interventions_config(config)
        + check_quantization_config(config)
        + check_alignment_config(config)
    )
    for key, problem in found:
        raise ConfigError(key, problem)


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_results_dir(results_dir: str, checkout: str | os.PathLike | None) -> None:
    """``results_dir`` is neither ``/``, nor the checkout (``checkout``, and the working directory), nor a
    folder that holds it, nor inside a system folder (:data:`SYSTEM_FOLDERS`): each config writes only
    below its own results folder. Outside the checkout is fine (a cluster's scratch space)."""
    where = Path(os.path.realpath(results_dir))  # symlinks resolved: a link to .. is ..
    if where == Path(where.anchor):
        raise ConfigError("results_dir", f"{results_dir} is the root folder; give each config its own folder")
    too_long = next((part for part in where.parts if len(os.fsencode(part)) > NAME_MAX), None)
    if too_long is not None:
        raise ConfigError("results_dir", f"a folder name in it is over {NAME_MAX} bytes: {too_long[:40]}...")
    checkouts = {Path(os.path.realpath(p)) for p in (os.getcwd(), checkout) if p is not None}
    for folder in checkouts:
        if _inside(folder, where):
            raise ConfigError(
                "results_dir",
                f"{results_dir} is the checkout {folder} or a folder that holds it; "
                f"give each config its own folder inside, e.g. results/<name>",
            )
    if any(_inside(where, folder) for folder in checkouts | user_folders()):
        return
    system = next((folder for folder in system_folders() if _inside(where, folder)), None)
    if system is not None:
        raise ConfigError(
            "results_dir",
            f"{results_dir} is inside the system folder {system}; give each config its own folder in the "
            f"checkout (results/<name>) or in your own space (a cluster's scratch)",
        )


# Folders that hold the operating system, never a build's outputs (the Filesystem Hierarchy Standard's, and
# macOS's), resolved where they are links (/lib -> usr/lib). A results_dir inside the checkout, the home
# folder or the temporary folder is never refused, wherever those lie (user_folders).
SYSTEM_FOLDERS = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
    "/sys", "/usr", "/var", "/System", "/Library", "/private/etc", "/private/var",
)  # fmt: skip
# Scratch space inside them: machine-wide temporary folders (/var/tmp) and macOS's per-user ones.
SCRATCH_FOLDERS = ("/var/tmp", "/var/folders", "/private/var/tmp", "/private/var/folders")
# The longest name of one folder on the file systems Linux and macOS use.
NAME_MAX = 255


def system_folders() -> list[Path]:
    return [Path(os.path.realpath(folder)) for folder in SYSTEM_FOLDERS if os.path.isdir(folder)]


def user_folders() -> set[Path]:
    """Where a user's own files lie, which no system folder check refuses: the home and temporary folders,
    and the system's scratch folders."""
    folders = {Path(os.path.realpath(tempfile.gettempdir()))}
    home = os.path.expanduser("~")
    if home not in ("~", "/"):
        folders.add(Path(os.path.realpath(home)))
    folders |= {Path(os.path.realpath(folder)) for folder in SCRATCH_FOLDERS if os.path.isdir(folder)}
    return folders


def read_config(
    config: dict, overrides: dict | None = None, checkout: str | os.PathLike | None = None
) -> dict:
    """``config`` with ``overrides`` (snakemake's ``--config`` values, typed by :func:`typed_value`)
    merged in, an optional stage set to null removed, its defaults filled in and checked, in place.
    Returns ``config``; the first problem is a :class:`ConfigError`."""
    check_size(config, "(top level)")
    if overrides:
        check_size(overrides, "--config")
        merge(config, typed_value(overrides))
    for section in OPTIONAL_SECTIONS:
        if section in config and config[section] is None:
            del config[section]
    check_finite(config)
    validate_config(config)
    check_cross_keys(config)
    check_results_dir(config["results_dir"], checkout)
    return config


def yaml_error(path: str | os.PathLike) -> str | None:
    """Where and why the YAML file ``path`` does not parse (``FILE, line L, column C: problem``), or None."""
    try:
        yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
        return f"{where}: {err.problem or err.context} (not valid YAML)"
    except yaml.YAMLError as err:
        return f"{path}: {str(err).splitlines()[0]} (not valid YAML)"
    return None


def check_config_file(path: str | os.PathLike) -> None:
    """A config file that does not parse is a :class:`ConfigError` naming the file, line and column; one
    that is empty, or holds no mapping of keys, is one too."""
    problem = yaml_error(path)
    if problem:
        where, _, what = problem.partition(": ")
        raise ConfigError(where, what)
    document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(document, dict):
        what = "is empty" if document is None else f"holds a {type(document).__name__}"
        raise ConfigError(str(path), f"{what}; a pipeline config is a mapping of keys, as config/smoke.yaml")


def unwritable(path: str | os.PathLike) -> str | None:
    """Why no directory can be made and written at ``path``, or None when one can (as far as permissions
    and a read-only mount say: a full disk or a quota is the job's one line later).

    Found without writing anything: the nearest existing parent of ``path`` must be a directory that this
    user may write into and that is not on a read-only file system. Parsing the workflow, and a dry run,
    write nothing (docs/design.md §6); root passes the permission check almost anywhere, which is why
    :func:`check_results_dir` refuses the system folders by name."""
    parent = Path(path)
    try:
        while not os.path.lexists(parent):
            parent = parent.parent
    except OSError as err:
        return f"{parent}: {err.strerror}"
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot create a directory in {parent} (permission denied)"
    try:
        read_only = bool(os.statvfs(parent).f_flag & os.ST_RDONLY)
    except OSError as err:
        return f"{parent}: {err.strerror}"
    if read_only:
        return f"cannot create a directory in {parent} (read-only file system)"
    return None


def check_writable(folders: dict[str, list[str]]) -> None:
    """{what the folders are: the folders}: a folder no job could write is one line now, not a failed
    job later."""
    for key, paths in folders.items():
        for folder in paths:
            reason = unwritable(folder)
            if reason:
                raise ConfigError(key, f"{folder} is not writable: {reason}")
