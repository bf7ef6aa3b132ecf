"""Stored tensor shapes against the shapes a model's config implies, checked before any model is built.

One helper for every checkpoint format (nanoGPT ``ckpt.pt``, Hugging Face folders): the
caller states what its config implies (``{name: shape}``) and passes what the file stores
(``{name: shape}``, e.g. from a safetensors header without reading the data), and gets
one line naming the first tensor that disagrees instead of a loader's traceback.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from attnid.common.errors import UserError

Shape = tuple[int, ...]


def format_shape(shape: Iterable[int]) -> str:
    """As Python writes the tuple: ``(384, 128)``, ``(384,)``."""
    return str(tuple(int(size) for size in shape))


def shape_mismatches(
    expected: Mapping[str, Iterable[int]], stored: Mapping[str, Iterable[int]], required: bool = True
) -> list[str]:
    """Every disagreement as a phrase, in ``expected``'s order: a stored shape that is not the expected
    one, and (when ``required``) an expected tensor that is not stored. Stored tensors that ``expected``
    does not name are not judged."""
    problems = []
    for name, shape in expected.items():
        shape = tuple(int(size) for size in shape)
        if name not in stored:
            if required:
                problems.append(f"tensor {name} is missing (expected shape {format_shape(shape)})")
            continue
        have = tuple(int(size) for size in stored[name])
        if have != shape:
            problems.append(f"tensor {name} has shape {format_shape(have)}, expected {format_shape(shape)}")
    return problems


def shape_problem(
    expected: Mapping[str, Iterable[int]],
    stored: Mapping[str, Iterable[int]],
    where: str,
    source: str = "the config",
    required: bool = True,
) -> str | None:
    """One line for the first disagreement (and how many more there are), or None when all agree."""
    problems = shape_mismatches(expected, stored, required)
    if not problems:
        return None
    more = f"; {len(problems) - 1} more tensor(s) disagree" if len(problems) > 1 else ""
    return f"{where}: {problems[0]} from {source}{more}"


def check_tensor_shapes(
    expected: Mapping[str, Iterable[int]],
    stored: Mapping[str, Iterable[int]],
    where: str,
    source: str = "the config",
    required: bool = True,
) -> None:
    """Raise a one-line UserError (:func:`shape_problem`) when a stored shape disagrees with ``expected``."""
    problem = shape_problem(expected, stored, where, source, required)
    if problem is not None:
        raise UserError(problem)
