"""``tunecore ncu profile``: add CPU profile metrics (callgrind, llvm-mca) to the rows of a dataset;
``tunecore ncu profile-batch``: Nsight Compute metrics of a batch's programs (tunecore.measure.batch), on the GPU
machine that times them."""

from __future__ import annotations

import argparse
from typing import Any

from tunecore.cli import Parser, add_devices, add_seed, count, names, number, render
from tunecore.interfaces import UsageError


def add_commands(register: Any) -> None:
    ncu = register("ncu", cmd_ncu, help="hardware-profile metrics for the ncu cost model")
    sub = ncu.add_subparsers(dest="ncu_command", required=True, parser_class=Parser)
    profile = sub.add_parser("profile", help="profile rows of a dataset (in place, resumable)")
    profile.add_argument("--dataset", "-d", required=True, help="dataset file (.parquet), updated in place")
    profile.add_argument("--limit", type=count(1), required=True, help="rows to profile in this call")
    profile.add_argument("--per-task", type=count(1), default=None,
                         help="profile at most this many rows per task, counting earlier calls")
    profile.add_argument("--workloads", type=names, default=[], help="only tasks of these workloads (comma-separated)")
    add_devices(profile, "profile rows (this machine's or another's whose code runs here: its L1/L2 sizes are "
                         "simulated; default: every device of this machine in the dataset) of")
    profile.add_argument("--max-latency", type=number(1e-9), default=0.05,
                         help="skip rows slower than this many seconds (callgrind runs 150-300x slower; default 0.05)")
    profile.add_argument("--timeout", type=number(1e-9), default=120.0, help="seconds per row (default 120)")
    profile.add_argument("--retry-failed", action="store_true",
                         help="profile again the rows that failed before (after a fix of valgrind or the harness)")
    add_seed(profile, "the choice of rows")
    profile.add_argument("--json", action="store_true")
    batch = sub.add_parser("profile-batch", help="Nsight Compute metrics of a batch's programs (`tunecore dataset "
                                                 "export-batch`), on the GPU machine (resumable); `tunecore dataset "
                                                 "import-batch` puts them into the rows")
    batch.add_argument("directory")
    batch.add_argument("--limit", type=count(1), default=None, help="programs to profile in this call (default: all)")
    batch.add_argument("--chunk", type=count(1), default=200,
                       help="programs per ncu process (default 200; the profiles are saved after each)")
    batch.add_argument("--json", action="store_true")


def cmd_ncu(args: argparse.Namespace) -> int:
    import os

    from tunecore_ncu_costmodel.profilers import profile_batch, profile_dataset

    if args.ncu_command == "profile-batch":
        if not os.path.exists(os.path.join(args.directory, "manifest.json")):
            raise UsageError(f"{args.directory}: not a batch directory (no manifest.json)")
        with render.tracker() as on_progress:
            out = profile_batch(args.directory, limit=args.limit, chunk=args.chunk, on_progress=on_progress)
        render.fields(out, args.json)
        return 0

    if not os.path.exists(args.dataset):
        raise UsageError(f"--dataset {args.dataset}: no such file")
    workloads, devices = args.workloads, args.devices or []
    with render.tracker() as on_progress:
        out = profile_dataset(args.dataset, limit=args.limit, per_task=args.per_task, workloads=workloads,
                              devices=devices, max_latency=args.max_latency, timeout=args.timeout, seed=args.seed,
                              retry_failed=args.retry_failed, on_progress=on_progress)
    render.fields(out, args.json)
    return 0
