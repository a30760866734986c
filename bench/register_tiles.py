"""Which register tiles of the blocked-conv sketches a tuning run tried on each conv, and how fast each got.

tunecore's blocked-conv rule (tunecore/blocked_conv.py) offers one sketch per register tile (FC filter blocks x OW
output pixels) and loop order, beside MetaSchedule's own multi-level tiling. This reads the stores a
``bench/conv_kernels.py`` run left in its work directory and gives, per conv and per tile, the trials and the best
latency measured during tuning (not re-measured together: read a difference of a few percent as level):

    python bench/register_tiles.py --work tmp/ck-work2 --name register_tiles-r18-3x3-spr
"""

from __future__ import annotations

import collections
import glob
import json
import os

from tunecore.api import open_store
from tunecore.experiments import command_line, script_parser, write_results


def tile_of(trace_json: str) -> str:
    """"FCxOW tile" / "FCxOW channels-outer" for a sketch of the blocked-conv rule, else "multi-level tiling"."""
    insts = json.loads(trace_json)[0]
    factors = [i[1][2] for i in insts if i[0] == "Split" and i[1][1] == "None"][:2]
    if len(factors) < 2 or not any(i[0] == "Reorder" for i in insts):
        return "multi-level tiling"
    order = "tile" if any(i[0] == "CacheWrite" for i in insts) else "channels-outer"
    return f"{factors[0]}x{factors[1]} {order}"


def conv_tiles(path: str) -> dict:
    store = open_store(f"sqlite:{path}", create=False)
    try:
        convs = [t for t in store.get_tasks() if "conv2d_NCHWc" in t.name]
        out = {}
        for task in convs:
            by_tile: dict[str, list[float]] = collections.defaultdict(list)
            failed = 0
            for record in store.records(task.task_id):
                if record.latency is None:
                    failed += 1
                else:
                    by_tile[tile_of(record.trace_json)].append(record.latency)
            best = min((min(v) for v in by_tile.values()), default=None)
            out[task.name] = {"flops": task.flops, "failed": failed, "best_s": best, "tiles": {
                tile: {"trials": len(v), "best_s": min(v), "gflops": task.flops / min(v) / 1e9,
                       "vs_best": min(v) / best}
                for tile, v in sorted(by_tile.items(), key=lambda kv: min(kv[1]))}}
        return out
    finally:
        store.close()


def main() -> None:
    parser = script_parser(__doc__, __file__)
    parser.add_argument("--work", required=True, help="a bench/conv_kernels.py work directory")
    parser.add_argument("--name", default="register_tiles", help="the results' file name (default: %(default)s)")
    args = parser.parse_args()
    stores = sorted(glob.glob(os.path.join(args.work, "*.nchwc.db")))
    if not stores:
        parser.error(f"--work {args.work}: no *.nchwc.db store (a bench/conv_kernels.py --layouts nchwc work dir)")
    report = {"command": command_line("register_tiles.py"),
              "convs": {os.path.basename(p).removesuffix(".nchwc.db"): conv_tiles(p) for p in stores}}
    lines = ["# Register tiles tried per conv (tuning-time latencies)", "",
             f"Command: `{report['command']}`. Per conv: each sketch's trials and best latency during tuning, "
             "GFLOPS, and its best against the conv's best (1.00 = the tile that won).", ""]
    for conv, tasks in report["convs"].items():
        for name, data in tasks.items():
            lines += [f"## {conv} (`{name}`)", "", "| tile (filter blocks x pixels, order) | trials | best ms | GFLOPS "
                      "| vs best |", "|---|---:|---:|---:|---:|"]
            lines += [f"| {tile} | {t['trials']} | {t['best_s'] * 1e3:.3f} | {t['gflops']:.0f} | "
                      f"{t['vs_best']:.2f} |" for tile, t in data["tiles"].items()]
            lines.append("")
    write_results(args.out, args.name, report, "\n".join(lines))


if __name__ == "__main__":
    main()
