"""Files of learned models (cost models, generators): one header, checked the same way for every model, one-line
errors, nothing unpickled.

The header is ``{"format": "tunecore-KIND", "version": N}`` plus the model's own metadata. Two containers: JSON
(``save_model_json`` / ``load_model_json``, e.g. xgboost boosters as their JSON) and torch (``save_model_torch`` /
``load_model_torch``: a state dict read with ``weights_only=True``, the header as a JSON string beside it). A file
of another kind or version, a file of another program and a missing file are a UsageError naming the path.
"""

from __future__ import annotations

import json
import os
from typing import Any

from tunecore.errors import UsageError


def _header(kind: str, version: int, metadata: dict[str, Any]) -> dict[str, Any]:
    return {"format": f"tunecore-{kind}", "version": version, **metadata}


# (file, steps done) of the newest training checkpoint this process wrote or resumed from: what an interrupted
# command tells the user it kept (tunecore.cli)
last_checkpoint: tuple[str, int] | None = None


def _checked(path: str, metadata: Any, kind: str, version: int) -> dict[str, Any]:
    found = metadata.get("format") if isinstance(metadata, dict) else None
    if found != f"tunecore-{kind}":
        raise UsageError(f"{path}: not a tunecore {kind} model file" + (f" (its format is {found})" if found else ""))
    if metadata.get("version") != version:
        raise UsageError(f"{path}: {kind} model file version {metadata.get('version')}; this tunecore reads version "
                         f"{version}")
    return metadata


def _unreadable(path: str, kind: str, error: BaseException) -> UsageError:
    if isinstance(error, FileNotFoundError):
        return UsageError(f"{path}: no such file")
    return UsageError(f"{path}: not a tunecore {kind} model file ({type(error).__name__})")


def save_model_json(path: str, kind: str, version: int, content: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(_header(kind, version, content), f)


def load_model_json(path: str, kind: str, version: int) -> dict[str, Any]:
    """The file's content, header included, once the header says it is a ``kind`` model of ``version``."""
    try:
        with open(path) as f:
            saved = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise _unreadable(path, kind, error) from None
    return _checked(path, saved, kind, version)


def save_model_torch(path: str, kind: str, version: int, metadata: dict[str, Any], state_dict: dict[str, Any]) -> None:
    import torch

    torch.save({"metadata": json.dumps(_header(kind, version, metadata)), "state_dict": state_dict}, path)


def load_model_torch(path: str, kind: str, version: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata, state dict) of a ``kind`` model of ``version``, read without unpickling anything."""
    import torch

    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        metadata, state_dict = json.loads(saved["metadata"]), saved["state_dict"]
    except Exception as error:  # not a file, not torch's format, not ours
        raise _unreadable(path, kind, error) from None
    return _checked(path, metadata, kind, version), state_dict


# A training command's state beside its output, so that the same command run again continues where it stopped
# (Ctrl-C, `kill`, a machine that went away): written every so many steps, removed once the weights are written.
CHECKPOINT = ".ckpt"


def load_checkpoint(path: str, kind: str, settings: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """(steps done, state) a run with the same ``settings`` saved at ``path``; None if there is none, or another
    run's, or one cut short while it was written (training then starts over)."""
    if not os.path.exists(path):
        return None
    try:
        saved, state = load_model_torch(path, f"{kind}-checkpoint", 1)
    except UsageError:
        return None
    if saved.get("settings") != settings:
        return None
    global last_checkpoint
    last_checkpoint = (path, int(saved["step"]))
    return last_checkpoint[1], state


def save_checkpoint(path: str, kind: str, settings: dict[str, Any], step: int, state: dict[str, Any]) -> None:
    partial = f"{path}.{os.getpid()}.partial"  # a stop while writing leaves the last whole checkpoint
    try:
        save_model_torch(partial, f"{kind}-checkpoint", 1, {"settings": settings, "step": step}, state)
        os.replace(partial, path)
        global last_checkpoint
        last_checkpoint = (path, step)
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        raise
