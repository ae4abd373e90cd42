"""A decider's threshold read from a calibration file (`rigkit trigger calibrate --out FILE`).

The file holds, per decider, the threshold chosen on a data set's dev split for one model's
probabilities. `decider.calibration: FILE` (`--calibration FILE`) runs each decider the file
calibrated at that threshold, with the parameters the calibration replayed it under.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from rigkit.config import DeciderConfig
from rigkit.errors import InputError

__all__ = ["REPLAY_PARAMS", "calibrated_section"]

# The parameters a decider was replayed under when its threshold was chosen: labels store no
# attention, so entropy is calibrated on entropy alone and its threshold holds only without it.
REPLAY_PARAMS: dict[str, dict[str, Any]] = {"entropy": {"use_attention": False}}


def _read(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"calibration file not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"calibration file {path} is not readable JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("deciders"), dict) or "generator" not in data:
        raise InputError(f"{path} is not a calibration file (rigkit trigger calibrate --out FILE writes one)")
    return data


def calibrated_section(section: DeciderConfig, model: str) -> DeciderConfig:
    """`section` at the threshold its `calibration` file chose for this decider and `model`.

    A decider the file did not calibrate (a classifier, `always`, ...) keeps its section as it is,
    so one file serves an eval of several systems. A file made for another model, or one that
    chose no threshold for this decider, is an InputError saying why.
    """
    if not section.calibration:
        return section
    path = section.calibration
    data = _read(str(path))  # read at each build: a file calibrated again in a notebook is the one used
    entry = data["deciders"].get(section.name)
    if entry is None:
        return section
    if data["generator"] != model:
        raise InputError(f"calibration {path} was chosen on {data['generator']}'s scores; this run's model is "
                         f"{model}: calibrate it for this model (rigkit trigger build-labels, then calibrate)")
    chosen = entry.get("chosen_threshold")
    if chosen is None:
        why = "; ".join(entry.get("notes") or []) or "no threshold chosen"
        raise InputError(f"calibration {path} chose no threshold for decider {section.name!r}: {why}")
    params = {**section.params, **REPLAY_PARAMS.get(section.name, {})}
    return dataclasses.replace(section, threshold=float(chosen), params=params)
