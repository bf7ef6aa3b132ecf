"""What a drawn figure must show, checked on its matplotlib artists (tests/reports/test_figures.py and
the figure tests of the studies, the interventions and the smoke build):

- every legend entry has a visible artist inside the axes: one with its label (or, for a legend that is a
  key of line styles, with its line style, marker and width) and a point within the axes' limits; a series
  drawn on its round-off floor counts by its floor line and marker;
- no label (a text or annotation in the axes) leaves its axes or overlaps the title, a marker or another
  label, measured on the renderer's boxes;
- a panel's own legend (one placed beside it) overlaps no other panel, nor its ticks' labels or title.
"""

from __future__ import annotations

import numpy as np
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.text import Text

from attnid.reports.figures.style import marker_boxes


def _inside(ax, artist, points) -> bool:
    """Whether any of ``points`` (in the artist's coordinates) falls within ``ax``'s box on the canvas."""
    points = np.asarray(points, dtype=float).reshape(-1, 2)
    points = points[np.isfinite(points).all(axis=1)]
    if not len(points):
        return False
    box = ax.get_window_extent().padded(1.0)
    display = artist.get_transform().transform(points)
    return bool(
        (
            (display[:, 0] >= box.x0)
            & (display[:, 0] <= box.x1)
            & (display[:, 1] >= box.y0)
            & (display[:, 1] <= box.y1)
        ).any()
    )


def _visible_artists(ax) -> list:
    """The lines, point collections, bands and patches of ``ax`` with a point inside the axes."""
    shown = []
    for line in ax.get_lines():
        if line.get_visible() and _inside(ax, line, np.column_stack(line.get_data())):
            shown.append(line)
    for collection in ax.collections:
        if isinstance(collection, PathCollection):
            offsets = np.asarray(collection.get_offsets(), dtype=float)
            display = collection.get_offset_transform().transform(offsets) if len(offsets) else offsets
            box = ax.get_window_extent().padded(1.0)
            if len(display) and any(box.contains(x, y) for x, y in display):
                shown.append(collection)
        elif isinstance(collection, PolyCollection):
            vertices = [path.vertices for path in collection.get_paths() if len(path.vertices)]
            if vertices and _inside(ax, collection, np.concatenate(vertices)):
                shown.append(collection)
    for patch in ax.patches:
        if _inside(ax, patch, patch.get_path().vertices):
            shown.append(patch)
    for container in ax.containers:  # errorbar and bar: the container carries the label
        if any(child in shown for child in container.get_children()):
            shown.append(container)
    return shown


def _line_style(line: Line2D) -> tuple:
    marker = line.get_marker()
    return (
        line.get_linestyle(),
        None if marker in (None, "None", "", " ") else marker,
        round(line.get_linewidth(), 1),
    )


def _same_style(handle, artist) -> bool:
    if isinstance(handle, Line2D) and isinstance(artist, Line2D):
        return _line_style(handle) == _line_style(artist)
    if isinstance(handle, Patch) and isinstance(artist, Patch):
        return np.allclose(handle.get_facecolor(), artist.get_facecolor())
    return False


def legend_entries(fig) -> list[tuple[str, object]]:
    """(label, handle) of every entry of the figure's and the axes' legends."""
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    return [
        (text.get_text(), handle)
        for legend in legends
        for text, handle in zip(legend.get_texts(), legend.legend_handles)
    ]


def invisible_legend_entries(fig) -> list[str]:
    """The legend entries of ``fig`` with no visible artist inside any of its axes."""
    fig.canvas.draw()
    shown = [artist for ax in fig.axes for artist in _visible_artists(ax)]
    labels = {artist.get_label() for artist in shown}
    drawn = {
        artist.get_label()
        for ax in fig.axes
        for artist in [*ax.get_lines(), *ax.collections, *ax.patches, *ax.containers]
    }
    # an entry names its series (it must be visible), or is a key of a line style no series is named by
    return [
        label
        for label, handle in legend_entries(fig)
        if label not in labels and (label in drawn or not any(_same_style(handle, a) for a in shown))
    ]


def visible_labels(ax) -> set[str]:
    """The labels of the artists of one panel that are visible inside it."""
    ax.figure.canvas.draw()
    return {artist.get_label() for artist in _visible_artists(ax)}


def overlapping_labels(fig) -> list[str]:
    """Each text of an axes that runs out of it or overlaps its title, a marker or another of its texts."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = []
    for ax in fig.axes:
        texts = [text for text in ax.texts if text.get_visible() and text.get_text()]
        # the text's own box (an annotation's box would take in its leader line, which ends at its point)
        boxes = [Text.get_window_extent(text, renderer) for text in texts]
        markers = marker_boxes(ax, renderer)
        title = ax.title.get_window_extent(renderer) if ax.get_title() else None
        inside = ax.get_window_extent(renderer).padded(1.0)
        for i, (text, box) in enumerate(zip(texts, boxes)):
            if not (inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1)):
                found.append(f"{text.get_text()!r} runs out of its axes {ax.get_title()!r}")
            if title is not None and box.overlaps(title):
                found.append(f"{text.get_text()!r} overlaps the title {ax.get_title()!r}")
            for other, other_box in zip(texts[i + 1 :], boxes[i + 1 :]):
                if box.overlaps(other_box):
                    found.append(f"{text.get_text()!r} overlaps {other.get_text()!r}")
            if any(box.overlaps(marker) for marker in markers):
                found.append(f"{text.get_text()!r} overlaps a marker in {ax.get_title()!r}")
    return found


def legends_over_other_panels(fig) -> list[str]:
    """Each legend of a panel whose box overlaps another panel (its axes, tick labels and title), but for a
    twin of its own panel (the same box)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = []
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent(renderer)
        own = ax.get_window_extent(renderer)
        for other in fig.axes:
            if other is ax or other.get_window_extent(renderer).bounds == own.bounds:
                continue
            if box.overlaps(other.get_tightbbox(renderer)):
                found.append(f"the legend of {ax.get_title()!r} overlaps {other.get_title()!r}")
    return found
