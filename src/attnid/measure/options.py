"""What ``attnid train`` chooses among in the measure layer, importable without torch (see
:mod:`attnid.model.options`)."""

from __future__ import annotations

# --metrics-device: where a log step's float64 linear algebra runs
METRICS_DEVICES = ("host", "device")
