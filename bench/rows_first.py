"""A store whose register-tiled convs split output rows, not output channels, between threads.

tunecore's blocked-conv sketch (tunecore/blocked_conv.py, order "tile") runs its loops as (n, filter-block groups,
rows, pixel groups, ...), and the parallel loop MetaSchedule fuses from the outermost ones hands each thread a
group of output channels: every thread reads the whole input, half of it written by the other core's previous
kernel. onnxruntime's MLAS splits a 64-channel conv by output rows instead. This script copies each task's best
record of a store into a new store, with rows moved before the filter-block groups where a task's name matches
``--tasks`` (the same tile, the same measured latency; compile checks the outputs), so that ``bench/e2e.py
--compare-store`` times both builds in the same passes:

    python bench/rows_first.py --store S.db --out rows.db [--tasks REGEX]
    python bench/e2e.py --models resnet-18 --tuners tunecore --layout nchwc --compare-store rows-first=rows.db ...
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys

from tunecore.api import open_store


def rows_first(trace_json: str) -> str | None:
    """The trace with the conv's rows loop moved before its filter-block groups, or None if it is not the
    register-tiled "tile" order."""
    insts, decisions = json.loads(trace_json)
    conv = [i[3][0] for i in insts if i[0] == "GetSBlock" and i[2][0] == "conv2d_NCHWc"]
    loops = [i[3] for i in insts if i[0] == "GetLoops" and conv and i[1] == conv[:1] and len(i[3]) == 9]
    reorder = next((i for i in insts if i[0] == "Reorder"), None)
    if not loops or reorder is None:
        return None
    n, oc, y = loops[-1][:3]
    oc_outer = next((i[3][0] for i in insts if i[0] == "Split" and i[1][0] == oc), oc)
    if reorder[1][:3] != [n, oc_outer, y]:
        return None
    reorder[1][1:3] = [y, oc_outer]
    return json.dumps([insts, decisions])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", required=True, help="a tunecore sqlite store")
    parser.add_argument("--out", required=True, help="the new store (must not exist)")
    parser.add_argument("--tasks", default="", help="edit only tasks whose name matches this regex (default: all)")
    args = parser.parse_args()
    if not os.path.isfile(args.store) or os.path.exists(args.out):
        parser.error(f"--store must exist ({args.store}) and --out must not ({args.out})")
    try:
        tasks = re.compile(args.tasks)
    except re.error as error:
        parser.error(f"--tasks {args.tasks!r}: not a regular expression ({error})")
    source, dest = open_store(args.store, create=False), open_store(args.out)
    for model in source.models():
        dest.put_tasks(source.get_tasks(model=model))
    last = (source.runs() or [{"info": {}, "device_id": None}])[-1]  # its layout, for compile; its device
    device = source.devices().get(last["device_id"])
    info = dict(last["info"], rows_first=args.tasks or "all", **({"device": device} if device else {}))
    run_id = dest.start_run(info)
    edited = []
    for task in source.get_tasks():
        best = source.best(task.task_id, k=1)
        if not best:
            continue
        trace = rows_first(best[0].trace_json) if tasks.search(task.name) else None
        dest.commit([dataclasses.replace(best[0], trace_json=trace or best[0].trace_json, run_id=run_id,
                                         key=best[0].key + (":rows-first" if trace else ""))])
        if trace:
            edited.append(task.name)
    dest.finish_run(run_id, {"rows_first": edited})
    print(f"{args.out}: {len(edited)} task(s) rows-first: {', '.join(edited) or 'none'}", file=sys.stderr)


if __name__ == "__main__":
    main()
