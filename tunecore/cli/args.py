"""Arguments several commands share, so that they are spelled and explained the same way everywhere."""

from __future__ import annotations

import argparse
import re


def add_common(p: argparse.ArgumentParser, *, model: bool = True, target: bool = True, store: bool = True,
               json_flag: bool = True) -> None:
    if model:
        p.add_argument("--model", "-m", required=True,
                       help="zoo:<name> | op:<name> | path to .onnx | file.py:factory (a PyTorch module) | "
                            "path to a Relax module .json")
        p.add_argument("--input-shape", action="append", metavar="NAME=DIMS", dest="input_shape",
                       help="shape of an ONNX or PyTorch model's input, e.g. input_ids=1x128 (repeatable); "
                            "symbolic batch dimensions default to 1")
        p.add_argument("--layout", default=None,
                       help="the layout a network's convs are tuned and compiled in: nchw (the model's own, default) "
                            "| nhwc | nchwc (blocked, B = the CPU's vector lanes); `run --layout auto` probes each and "
                            "keeps the fastest build; `compile` without it uses the layout the model was last tuned "
                            "in")
        p.add_argument("--winograd", action="store_true", default=None,
                       help="give 3x3 stride-1 NCHW convs Winograd kernels beside their direct ones; `compile` keeps "
                            "Winograd for a conv only where its tuned kernel measured faster (and follows the model's "
                            "last run when not given)")
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
                   help="how trials are spread over a network's tasks (default: gradient, as in Ansor)")
    p.add_argument("--option", "-O", action="append", metavar="ROLE.KEY=VALUE",
                   help="component option: ROLE.KEY=VALUE for whichever component fills the role, or NAME.KEY=VALUE "
                        "for the component NAME only, e.g. -O measurer.repeat=5 -O ansor.population=128")


def duration(text: str) -> float:
    """Seconds of a duration as users write it: 3600, 90s, 30m, 1.5h."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 3600, 90m, 2h)")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]
