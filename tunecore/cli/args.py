"""Arguments several commands share, so that they are spelled and explained the same way everywhere."""

from __future__ import annotations

import argparse
import re
from typing import Callable


def add_common(p: argparse.ArgumentParser, *, model: bool = True, target: bool = True, store: bool = True,
               json_flag: bool = True) -> None:
    if model:
        p.add_argument("--model", "-m", required=True,
                       help="zoo:<name> | op:<name> | corpus:<name> (needs the models extra) | path to .onnx | "
                            "file.py:factory (a PyTorch module) | path to a Relax module .json")
        p.add_argument("--input-shape", action="append", metavar="NAME=DIMS", dest="input_shape",
                       help="shape of an ONNX or PyTorch model's input, e.g. input_ids=1x128 (repeatable); "
                            "symbolic batch dimensions default to 1")
        p.add_argument("--layout", default=None,
                       help="the layout a network's convs are tuned and compiled in: nchw (the model's own, default) "
                            "| nhwc | nchwc (blocked, B = the CPU's vector lanes); `run --layout auto` probes each and "
                            "keeps the fastest build; `compile` without it uses the layout the model was last tuned "
                            "in")
        p.add_argument("--winograd", action="store_true", default=None,
                       help="give 3x3 stride-1 convs (nchw, nchwc) Winograd kernels beside their direct ones; "
                            "`compile` keeps Winograd for a conv only where its tuned kernel measured faster (and "
                            "follows the model's last run when not given); on CPUs `run` then times cold "
                            "(-O measurer.cpu_cache_flush=true, repeat=10), as a network runs the kernels")
    if target:
        p.add_argument("--target", "-t", default="llvm",
                       help="llvm (this CPU, real mcpu) | cuda | a TVM target tag, e.g. nvidia/nvidia-h100 or "
                            "aws/cpu/c5.large | a TVM JSON target dict (default: llvm)")
    if store:
        p.add_argument("--store", "-s", default=None,
                       help="record store: a file path (sqlite) or NAME:LOCATION, e.g. memory: (default: tunecore.db)")
    if json_flag:
        p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def add_tuning(p: argparse.ArgumentParser) -> None:
    """How candidates are measured and trials spread over tasks (``run`` and ``bench``)."""
    from tunecore.schedulers import SCHEDULERS

    p.add_argument("--measurer", default="local", help="measurer (default: local; see `tunecore plugins`)")
    p.add_argument("--scheduler", choices=sorted(SCHEDULERS), default="gradient",
                   help="how trials are spread over a network's tasks (default: gradient, as in Ansor; "
                        "gradient-flops-warmup: first rounds sized by each task's share of the FLOPs)")
    p.add_argument("--option", "-O", action="append", metavar="ROLE.KEY=VALUE",
                   help="component option: ROLE.KEY=VALUE for whichever component fills the role, or NAME.KEY=VALUE "
                        "for the component NAME only, e.g. -O measurer.repeat=5 -O ansor.population=128")


def duration(text: str) -> float:
    """Seconds of a duration as users write it: 3600, 90s, 30m, 1.5h."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 3600, 90m, 2h)")
    seconds = float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"expected a duration > 0, not {text!r}")
    return seconds


def count(low: int = 1) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low`` (a count, a size, a budget); anything else is the flag's one-line
    error, e.g. "argument --per-task: expected an integer >= 1, not '0'"."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, not {text!r}")
        return value

    return parse


def number(low: float, high: float = float("inf")) -> Callable[[str], float]:
    """An argparse type: a number from ``low`` to ``high`` (a fraction, a spread)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not low <= value <= high:
            bounds = f">= {low:g}" if high == float("inf") else f"from {low:g} to {high:g}"
            raise argparse.ArgumentTypeError(f"expected a number {bounds}, not {text!r}")
        return value

    return parse


def names(text: str) -> list[str]:
    """An argparse type: a comma-separated list (workloads, components, devices), duplicates dropped."""
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list without empty items, not {text!r}")
    return list(dict.fromkeys(items))


def add_devices(p: argparse.ArgumentParser, what: str = "use only measurements on") -> None:
    p.add_argument("--devices", type=names, default=None,
                   help=f"{what} these devices: ids or id prefixes (see `tunecore dataset info`), comma-separated")


def add_filters(p: argparse.ArgumentParser) -> None:
    """The papers' data filters (tunecore.dataset.filtered)."""
    p.add_argument("--max-spread", type=number(0), default=None,
                   help="use only programs whose timings spread at most this much (std / mean, e.g. 0.02)")
    p.add_argument("--min-programs", type=count(1), default=None,
                   help="use only (task, device) groups with at least this many measured programs")


def add_seed(p: argparse.ArgumentParser, what: str = "every random choice") -> None:
    p.add_argument("--seed", type=int, default=0, help=f"seed of {what} (default: 0)")
