"""How the shipped dataset's profiles became one kind: the rows an earlier profiler made warm, made again cold.

    python plugins/ncu_costmodel/scripts/reprofile_warm.py datasets/cpu-programs.parquet [--check 8]

Until 2026-11-25 the CPU profiler called kernels faster than 2 ms once before the profiled call and slower ones
not, so a program's counts depended on its latency, the label (``cpu.warm = 1`` marks those rows). This takes
every such row into a scratch dataset, profiles it with ``profile_dataset`` (every program the same way: one
cold call, the caches of the row's device simulated) and writes the profiles back. It runs on any x86 machine
with AVX2 and valgrind: callgrind simulates the caches, so a device's counts do not depend on the machine that
makes them. ``--check N`` first re-profiles N rows profiled cold before, and prints how far the counts are from
the stored ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile

from tunecore_ncu_costmodel import cpu
from tunecore_ncu_costmodel.profilers import profile_dataset

from tunecore.dataset.table import Dataset

COUNTS = tuple(cpu.CALLGRIND_METRICS) + cpu.MCA_METRICS


def scratch(shipped: Dataset, rows: list, path: str) -> None:
    part = Dataset()
    for row in rows:
        part.add_device(shipped.devices[row.device_id])
        if row.task_key not in part.tasks:
            part.add_task(shipped.tasks[row.task_key])
        part.add(dataclasses.replace(row, profile={k: v for k, v in row.profile.items()
                                                   if not k.startswith(("cpu.", "mca."))}))
    part.save(path)


def profiles(path: str, devices: set[str]) -> dict[tuple, dict]:
    print(profile_dataset(path, limit=len(Dataset.load(path).rows), devices=sorted(devices)), flush=True)
    return {(r.task_key, r.program_key, r.device_id): r.profile for r in Dataset.load(path).rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset")
    parser.add_argument("--check", type=int, default=0, help="rows profiled cold before to profile again first")
    args = parser.parse_args()
    shipped = Dataset.load(args.dataset)
    work = tempfile.mkdtemp(prefix="tunecore-reprofile-")
    if args.check:
        cold = [r for r in shipped.rows if r.profile.get("cpu.warm") == 0.0 and "cpu.instructions" in r.profile]
        cold = cold[::max(1, len(cold) // args.check)][:args.check]
        scratch(shipped, cold, os.path.join(work, "check.parquet"))
        again = profiles(os.path.join(work, "check.parquet"), {r.device_id for r in cold})
        for metric in COUNTS:
            errors = [abs(again[key][metric] / r.profile[metric] - 1) for r in cold
                      for key in [(r.task_key, r.program_key, r.device_id)]
                      if r.profile.get(metric) and again[key].get(metric) is not None]
            print(f"{metric}: largest relative difference {max(errors, default=0):.2e} over {len(errors)} rows")
    stale = [r for r in shipped.rows if r.profile.get("cpu.warm") == 1.0]
    print(f"{len(stale)} rows profiled warm", flush=True)
    scratch(shipped, stale, os.path.join(work, "stale.parquet"))
    made = profiles(os.path.join(work, "stale.parquet"), {r.device_id for r in stale})
    for row in stale:
        row.profile = {**{k: v for k, v in row.profile.items() if not k.startswith(("cpu.", "mca."))},
                       **made[(row.task_key, row.program_key, row.device_id)]}
    for row in shipped.rows:
        if row.profile.get("cpu.warm") == 0.0:
            del row.profile["cpu.warm"]  # the one way every profile is now made
    shipped.save(args.dataset)
    print(f"wrote {args.dataset}")


if __name__ == "__main__":
    main()
