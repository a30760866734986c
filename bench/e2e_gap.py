"""Where a tuned network's time goes: each kernel in the compiled model vs alone vs onnxruntime's same layer.

For each network of bench/e2e.py (the same ONNX export) and a tunecore store tuned on it:

- **in model**: every VM call of the tuned build timed through the VM's instrument hook (median over
  runs of each call's seconds, summed per function); the rest of the whole-call latency is the VM's own
  time (allocation, argument handling, the instrument's calls excluded).
- **alone**: each task's best stored program built and timed alone like the measurer times it (warm
  caches, random inputs); tasks with no record are timed unscheduled, as the build leaves them.
- **alone, cold**: the same, each timing one call right after its weights and output were flushed from the
  caches (``-O measurer.cpu_cache_flush=true``'s timing): inside the model a layer's weights come from memory,
  which a warm timing hides (ResNet-18's Winograd kernels, whose transformed weights are 4x the filter, ran 2x their
  warm time inside the model).
- **onnxruntime**: its profiler's per-node times on the same file, matched to TVM kernels by operator
  kind and output shape (ORT fuses Conv+Add+Relu and MatMul+Add as TVM does, so most layers match one
  to one).

The three alternate in ``--passes`` passes (each the median of its runs), and each number is the median over the
passes: timed one after the other, minutes apart, they would differ by the host's drift as well.

    python bench/e2e_gap.py --model resnet-18 --store S.db [--onnx NET.onnx] [--layout nchwc] [--passes 3]

Writes bench/results/e2e_gap-<model>.{json,md}.
"""

from __future__ import annotations

import collections
import json
import os
import re
import tempfile
import time
from typing import Any

import numpy as np

from tunecore.experiments import command_line, environment, script_parser, write_results
from tunecore.layouts import LAYOUTS


def in_model_seconds(runnable: Any, runs: int) -> dict[str, dict]:
    """Per VM-called function: calls per inference and median seconds per inference, over ``runs``."""
    per_run: list[dict[str, list[float]]] = []
    started = [0.0]  # VM calls do not nest: the one under way
    current: dict[str, list[float]] = collections.defaultdict(list)

    def instrument(func: Any, symbol: str, before: bool, ret: Any, *args: Any) -> int:
        if before:
            started[0] = time.perf_counter()
        else:
            current[symbol].append(time.perf_counter() - started[0])
        return 0

    runnable.vm.set_instrument(instrument)
    try:
        for _ in range(runs + 1):  # the first run warms up
            current.clear()
            runnable.outputs()
            per_run.append({k: list(v) for k, v in current.items()})
    finally:
        runnable.vm.set_instrument(None)
    out = {}
    for symbol in per_run[-1]:
        totals = [sum(run.get(symbol, [])) for run in per_run[1:]]
        out[symbol] = {"calls": len(per_run[-1][symbol]), "ms": float(np.median(totals)) * 1e3}
    return out


def _task_name(symbol: str) -> str:
    """The task a compiled function is: the layout rewrite renames a kernel whose weights it packed."""
    return symbol.removesuffix("_prepacked")


def built_tasks(workload: Any, target: Any, tasks: list) -> dict[str, Any]:
    """The build's kernel names -> the tuned tasks they are (by structure). Kernels are named in the order the
    fused module has them, so a build with some convs by Winograd names them unlike the extraction, which had
    every eligible conv both ways."""
    import dataclasses

    from tunecore.workloads import extract_tasks

    by_hash = {t.workload_hash: t for t in tasks}
    as_built = extract_tasks(dataclasses.replace(workload, winograd=False), target)  # winograd_convs: the chosen
    return {t.name: by_hash[t.workload_hash] for t in as_built if t.workload_hash in by_hash}


def build_alone(tasks: list, database: Any, target: Any, directory: str) -> dict[str, tuple[str, list]]:
    """Each task's program as the tuned build compiles it, built alone by the measurer's own worker functions
    (packed weights passed packed): task name -> (library path, its arguments)."""
    import tvm

    from tunecore.compile import scheduled_operator
    from tunecore.measure import worker
    from tunecore.tvmjson import target_to_json
    from tunecore.workloads import Workload

    target_json = target_to_json(target)
    out = {}
    for task in tasks:
        mod = scheduled_operator(Workload(task.name, task.mod, False), target, database)
        path, _, args, _ = worker.build(tvm.ir.save_json(mod), target_json, directory)
        out[task.name] = (path, args)
    return out


def alone_seconds(built: dict[str, tuple[str, list]], target: Any, cold: bool = False) -> dict[str, float]:
    """Each built task timed alone as the measurer times it: median of 5 timings of at least 50 ms each, or
    ``cold``, of 20 single calls each after a flush of all arguments but the input."""
    from tunecore.measure import worker
    from tunecore.tvmjson import target_to_json

    target_json = target_to_json(target)
    evaluator = dict(number=1, repeat=20 if cold else 5, min_repeat_ms=50, enable_cpu_cache_flush=cold)
    return {name: float(np.median(worker.run(path, target_json, args, evaluator, None)[0]))
            for name, (path, args) in built.items()}


def ort_node_times(onnx_path: str, feed: dict, threads: int, runs: int) -> tuple[list[dict], float]:
    """onnxruntime's per-node times (median over runs, ms) and its median whole-run latency (ms)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
    for _ in range(runs + 1):
        session.run(None, feed)
    with open(session.end_profiling()) as f:
        events = json.load(f)
    nodes: dict[str, dict] = {}
    whole = []
    for event in events:
        if event.get("cat") == "Session" and event.get("name") == "model_run":
            whole.append(event["dur"] / 1e3)
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        args = event.get("args", {})
        node = nodes.setdefault(event["name"], {"op": args.get("op_name", "?"), "ms": [],
                                                "shape": _ort_output_shape(args)})
        node["ms"].append(event["dur"] / 1e3)
    rows = [{"node": name[:-len("_kernel_time")], "op": n["op"], "shape": n["shape"],
             "ms": float(np.median(n["ms"][-runs:]))} for name, n in nodes.items()]
    return rows, float(np.median(whole[1:])) if len(whole) > 1 else float("nan")


def _ort_output_shape(args: dict) -> tuple:
    for entry in args.get("output_type_shape", [])[:1]:
        for dims in entry.values():
            return tuple(int(d) for d in dims)
    return ()


_KINDS = (("conv", ("conv",)), ("matmul", ("matmul", "dense", "gemm", "batch_matmul")),
          ("softmax", ("softmax",)), ("norm", ("layer_norm", "layernormalization", "batchnorm")),
          ("pool", ("pool",)))


def kind_of(name: str) -> str:
    """The operator kind a layer is matched on: conv, matmul, softmax, norm, pool or other."""
    lowered = name.lower()
    for kind, needles in _KINDS:
        if any(n in lowered for n in needles):
            return kind
    return "other"


def match(tvm_rows: list[dict], ort_rows: list[dict]) -> list[dict]:
    """Layer groups keyed by (kind, output shape): TVM's and onnxruntime's times side by side."""
    groups: dict[tuple, dict] = {}
    for row in tvm_rows:
        group = groups.setdefault((kind_of(row["kernel"]), row["shape"]), _group())
        group["tvm_kernels"].append(row["kernel"])
        for key in ("in_model_ms", "alone_ms", "alone_cold_ms", "calls"):
            group[key] += row[key]
    for row in ort_rows:
        group = groups.setdefault((kind_of(row["op"]), row["shape"]), _group())
        group["ort_nodes"].append(row["op"])
        group["ort_ms"] += row["ms"]
    out = [{"kind": kind, "shape": "x".join(map(str, shape)), **g} for (kind, shape), g in groups.items()]
    return sorted(out, key=lambda g: -max(g["in_model_ms"], g["ort_ms"]))


def _as_nchw(shape: tuple, layout: str) -> tuple:
    """A kernel's output in the layout it was tuned in, as the ONNX model's own NCHW, which onnxruntime's nodes
    report: (N, C/B, H, W, B) in nchwc, (N, H, W, C) in nhwc."""
    if layout == "nchwc" and len(shape) == 5:
        n, blocks, h, w, block = shape
        return (n, blocks * block, h, w)
    if layout == "nhwc" and len(shape) == 4:
        n, h, w, c = shape
        return (n, c, h, w)
    return shape


def _group() -> dict:
    return {"tvm_kernels": [], "ort_nodes": [], "in_model_ms": 0.0, "alone_ms": 0.0, "alone_cold_ms": 0.0, "calls": 0,
            "ort_ms": 0.0}


def analyse(onnx_path: str, store_file: str, runs: int, layout: str = "nchw", passes: int = 3,
            winograd: bool = False) -> dict:
    import tvm

    from tunecore.check import max_relative_error
    from tunecore.compile import Runnable, best_database, build, choose_winograd, random_inputs
    from tunecore.store.sqlite import SqliteStore
    from tunecore.targets import resolve_target, use_target_threads
    from tunecore.workloads import extract_tasks, load_workload

    target = resolve_target("llvm")
    threads = use_target_threads(target)
    workload = load_workload(onnx_path, layout=layout, winograd=winograd)
    tasks = extract_tasks(workload, target)
    store = SqliteStore(store_file)
    try:
        choose_winograd(workload, store, tasks)
        database, covered = best_database(store, tasks, target)
        counts = store.counts([t.task_id for t in tasks])
        trials = {t.name: counts.get(t.task_id, 0) for t in tasks}
        best = {t.name: (store.best(t.task_id, k=1) or [None])[0] for t in tasks}
    finally:
        store.close()
    executable = build(workload, target, database)
    inputs = random_inputs(workload)
    runnable = Runnable(executable, workload, target, inputs)
    untuned = Runnable(build(workload, target, tvm.s_tir.meta_schedule.database.MemoryDatabase()), workload, target,
                       inputs)
    error = max_relative_error(runnable.outputs(), untuned.outputs())
    del untuned
    whole_ms = runnable.time(10, 300) * 1e3
    name_of_input = workload.mod["main"].params[0].name
    # the three timings alternate in passes, so that the host's drift over minutes falls on all of them alike
    in_model, alone_passes, cold_passes, ort_passes = [], [], [], []
    with tempfile.TemporaryDirectory() as directory:
        built = build_alone(tasks, database, target, directory)
        for _ in range(passes):
            in_model.append(in_model_seconds(runnable, runs))
            alone_passes.append(alone_seconds(built, target))
            cold_passes.append(alone_seconds(built, target, cold=True))
            ort_passes.append(ort_node_times(onnx_path, {name_of_input: inputs[0]}, threads, runs))
    calls = {symbol: {"calls": c["calls"], "ms": float(np.median([p[symbol]["ms"] for p in in_model]))}
             for symbol, c in in_model[0].items()}
    alone = {name: float(np.median([p[name] for p in alone_passes])) for name in alone_passes[0]}
    cold = {name: float(np.median([p[name] for p in cold_passes])) for name in cold_passes[0]}
    ort_ms = collections.defaultdict(list)
    for rows, _ in ort_passes:
        for row in rows:
            ort_ms[row["node"]].append(row["ms"])
    ort_rows = [{**row, "ms": float(np.median(ort_ms[row["node"]]))} for row in ort_passes[0][0]]
    ort_whole_ms = float(np.median([whole for _, whole in ort_passes]))
    by_name = built_tasks(workload, target, tasks)
    tvm_rows = []
    for symbol, c in calls.items():
        task = by_name.get(_task_name(symbol))
        if task is None:
            continue
        record = best[task.name]
        tvm_rows.append({
            "kernel": task.name, "class": task.kernel_class, "calls": c["calls"], "in_model_ms": c["ms"],
            "alone_ms": alone[task.name] * 1e3 * c["calls"], "alone_cold_ms": cold[task.name] * 1e3 * c["calls"],
            "tuned": record is not None,
            "stored_best_ms": (record.latency * 1e3 * c["calls"]) if record is not None and record.latency else None,
            "trials": trials[task.name], "gflop": task.flops * c["calls"] / 1e9,
            "shape": _as_nchw(tuple(task.args[-1][2]), layout),
        })
    others = {s: c for s, c in calls.items() if _task_name(s) not in by_name}
    kernels_ms = sum(r["in_model_ms"] for r in tvm_rows)
    return {
        "onnx": onnx_path, "store": store_file, "threads": threads, "tasks": len(tasks), "tasks_tuned": covered,
        "outputs_match_untuned": error, "latency_ms": whole_ms, "kernels_in_model_ms": kernels_ms,
        "vm_builtins_ms": sum(c["ms"] for c in others.values()),
        "alone_ms": sum(r["alone_ms"] for r in tvm_rows), "alone_cold_ms": sum(r["alone_cold_ms"] for r in tvm_rows),
        "stored_best_ms": sum(r["stored_best_ms"] or 0.0 for r in tvm_rows),
        "ort_latency_ms": ort_whole_ms, "ort_nodes_ms": sum(r["ms"] for r in ort_rows),
        "kernels": sorted(tvm_rows, key=lambda r: -r["in_model_ms"]),
        "vm_builtins": others, "ort_nodes": ort_rows, "layers": match(tvm_rows, ort_rows),
        "winograd_convs": sorted(workload.winograd_convs),
    }


def summary_lines(r: dict) -> list[str]:
    """Markdown: the whole call against its parts, and onnxruntime's."""
    return ["| | ms |", "|---|---:|",
            f"| tuned build, whole call (median of 10) | {r['latency_ms']:.2f} |",
            f"| its kernels, timed inside the model | {r['kernels_in_model_ms']:.2f} |",
            f"| VM builtins (allocation, shape checks), inside the model | {r['vm_builtins_ms']:.2f} |",
            f"| the same kernels alone, re-timed now | {r['alone_ms']:.2f} |",
            f"| the same kernels alone, cold (weights flushed before each call) | {r['alone_cold_ms']:.2f} |",
            f"| the same kernels, best latency stored by tuning | {r['stored_best_ms']:.2f} |",
            f"| onnxruntime, whole run (profiling on) | {r['ort_latency_ms']:.2f} |",
            f"| onnxruntime, sum of its nodes | {r['ort_nodes_ms']:.2f} |", "",
            f"Tuned vs untuned outputs: max relative error {r['outputs_match_untuned']:.1g}; "
            f"{r['tasks_tuned']} of {r['tasks']} tasks tuned."
            + (f" Convs by Winograd (input, output): {', '.join(r['winograd_convs'])}." if r.get("winograd_convs")
               else ""), ""]


def layer_lines(r: dict, limit: int | None = None) -> list[str]:
    """Markdown: layers by kind and output shape, TVM in model vs alone vs onnxruntime, largest first."""
    lines = ["| kind | output | TVM kernels | calls | trials | in model ms | alone ms | alone cold ms | ORT ms | "
             "ORT nodes | gap to ORT ms |", "|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    trials = {k["kernel"]: k["trials"] for k in r["kernels"]}
    for g in r["layers"][:limit]:
        kernels = ", ".join(sorted(set(g["tvm_kernels"])))[:80] or "-"
        nodes = ", ".join(f"{n}x{c}" for n, c in collections.Counter(g["ort_nodes"]).items()) or "-"
        tried = sum(trials.get(k, 0) for k in set(g["tvm_kernels"]))
        lines.append(f"| {g['kind']} | {g['shape']} | {kernels} | {g['calls']} | {tried} | {g['in_model_ms']:.2f} | "
                     f"{g['alone_ms']:.2f} | {g['alone_cold_ms']:.2f} | {g['ort_ms']:.2f} | {nodes} | "
                     f"{g['in_model_ms'] - g['ort_ms']:+.2f} |")
    return lines + [""]


def markdown(report: dict) -> str:
    r = report["result"]
    lines = [f"# Where the time goes: {report['model']}", "",
             f"{report['environment']['cpu']}, {r['threads']} threads; command: `{report['command']}`. "
             f"Store `{os.path.basename(r['store'])}`.", "", *summary_lines(r),
             "## Layers: TVM in model vs alone vs onnxruntime (by kind and output shape)", "", *layer_lines(r),
             "## Kernels", "",
             "| kernel | calls | trials | GFLOP | in model ms | alone ms | alone cold ms | stored best ms | "
             "in model / alone |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for k in r["kernels"]:
        stored = "-" if k["stored_best_ms"] is None else f"{k['stored_best_ms']:.3f}"
        lines.append(f"| {k['kernel']} | {k['calls']} | {k['trials']} | {k['gflop']:.3f} | {k['in_model_ms']:.3f} | "
                     f"{k['alone_ms']:.3f} | {k['alone_cold_ms']:.3f} | {stored} | "
                     f"{k['in_model_ms'] / max(k['alone_ms'], 1e-9):.2f} |")
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = script_parser(__doc__, __file__)
    parser.add_argument("--model", required=True, help="a name of bench/e2e.py's networks (names the result)")
    parser.add_argument("--store", required=True, help="a SQLite store tuned on the ONNX file")
    parser.add_argument("--onnx", default=None,
                        help="the ONNX export (default: bench/e2e.py's, <tmp>/tunecore-bench-e2e/MODEL.onnx)")
    parser.add_argument("--runs", type=int, default=20, help="runs per pass (default: 20)")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--layout", default="nchw", choices=LAYOUTS,
                        help="the layout the store was tuned in (tunecore run --layout)")
    parser.add_argument("--winograd", action="store_true", help="the store was tuned with --winograd")
    args = parser.parse_args()
    if args.passes < 1 or args.runs < 1:
        parser.error(f"--passes {args.passes} --runs {args.runs}: both at least 1")
    onnx_path = args.onnx or os.path.join(tempfile.gettempdir(), "tunecore-bench-e2e", f"{args.model}.onnx")
    for path, what in ((onnx_path, "--onnx"), (args.store, "--store")):
        if not os.path.exists(path):
            parser.error(f"{what} {path}: no such file")
    result = analyse(onnx_path, args.store, args.runs, args.layout, args.passes, args.winograd)
    report = {"benchmark": "e2e_gap", "model": args.model, "result": result, "environment": environment(),
              "command": command_line("e2e_gap.py")}
    name = re.sub(r"[^a-z0-9-]", "", args.model.lower())
    write_results(args.out, f"e2e_gap-{name}", report, markdown(report))


if __name__ == "__main__":
    main()
