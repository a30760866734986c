"""Conv kernels: every distinct conv of ResNet-18 and MobileNetV2, tunecore's tuned kernel against onnxruntime's.

Each distinct conv of the zoo networks (shape, stride, padding, groups; batch 1) becomes a one-node ONNX model,
Conv with bias then Relu, seeded random weights. onnxruntime runs it with its default graph optimizations (MLAS;
Conv+Relu fused, NCHWc where MLAS wants it) on ``--threads`` threads, profiled: its latency is the conv node's
own kernel time (median over runs), not the reorders around it. tunecore tunes the same file in each
``--layouts`` variant (`tunecore run --model conv.onnx --layout L`; ``L+winograd`` adds `--winograd`, and the
faster of the direct and Winograd kernels counts, as compile would choose), then the conv task's best ``--remeasure``
programs are measured again together (5 timings of >= 50 ms each, in 8 shuffled passes; the best program's
median counts), with its fused bias and relu, without the layout transforms around it. GFLOPS = the conv's
multiply-adds x 2 / latency.

    python bench/conv_kernels.py [--models resnet-18,mobilenet-v2] [--layouts nchwc,nchw+winograd] [--trials 64]
                                 [--search random] [--cost-model none] [--threads 2]

Resumable: stores and ONNX files are kept in --work. Run it with nothing else on the machine. Writes
bench/results/conv_kernels.{json,md}.
"""

from __future__ import annotations

import json
import os

import numpy as np

from tunecore import experiments
from tunecore.experiments import command_line, environment, ratio_range, write_results


def distinct_convs(model: str) -> list[dict]:
    """The distinct 2-D convs of a zoo network, in the order they first run."""
    from tvm import relax

    from tunecore.workloads import load_workload

    mod = load_workload(f"zoo:{model}").mod
    seen: dict[tuple, dict] = {}

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.nn.conv2d":
            data, weight = (tuple(int(d) for d in arg.ty.shape) for arg in expr.args)
            a = expr.attrs
            conv = {"input": data, "weight": weight, "strides": [int(s) for s in a.strides],
                    "pads": [int(p) for p in a.padding], "groups": int(a.groups)}
            seen.setdefault(json.dumps(conv, sort_keys=True), conv)

    relax.analysis.post_order_visit(mod["main"], visit)
    return list(seen.values())


def conv_name(conv: dict) -> str:
    n, c, h, w = conv["input"]
    o, _, kh, kw = conv["weight"]
    kind = "dw" if conv["groups"] > 1 else ""
    return f"{kind}{kh}x{kw}s{conv['strides'][0]} {c}->{o} {h}x{w}"


def output_shape(conv: dict) -> list[int]:
    n, _, h, w = conv["input"]
    o, _, kh, kw = conv["weight"]
    (sh, sw), (top, left, bottom, right) = conv["strides"], conv["pads"]
    return [n, o, (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1]


def flops(conv: dict) -> float:
    _, i, kh, kw = conv["weight"]
    return 2.0 * float(np.prod(output_shape(conv))) * i * kh * kw


def write_onnx(conv: dict, path: str) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    o = conv["weight"][0]
    top, left, bottom, right = conv["pads"]
    weights = [numpy_helper.from_array((rng.standard_normal(conv["weight"]) * 0.1).astype("float32"), "W"),
               numpy_helper.from_array(rng.standard_normal(o).astype("float32"), "B")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], strides=conv["strides"],
                              pads=[top, left, bottom, right], group=conv["groups"]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, conv["input"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape(conv))], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def onnxruntime_kernel_seconds(path: str, conv: dict, threads: int, runs: int = 200) -> tuple[float, list[float]]:
    """Median kernel time of the conv node (Conv, FusedConv or NchwcConv) over profiled runs, and the medians of
    8 consecutive passes of them (the spread, as tunecore's side reports it)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    options.profile_file_prefix = path + ".profile"
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).uniform(-1, 1, conv["input"]).astype("float32")
    for _ in range(runs):
        session.run(None, {"x": x})
    profile = session.end_profiling()
    with open(profile) as f:
        events = json.load(f)
    os.remove(profile)
    durations = [e["dur"] for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
                 and "Conv" in e.get("args", {}).get("op_name", "")]
    timed = np.array(durations[len(durations) // 4:]) * 1e-6  # the first quarter warms up
    return float(np.median(timed)), [float(np.median(part)) for part in np.array_split(timed, 8)]


def tunecore_kernel_seconds(path: str, variant: str, store: str, args) -> dict:
    """Tune the one-conv model as ``variant`` says (a layout, ``+winograd`` for Winograd candidates), then measure
    each conv task's best programs again together; the fastest conv kernel counts (with Winograd: the direct or
    the Winograd one, as `tunecore compile` would choose)."""
    from tunecore.store.sqlite import SqliteStore
    from tunecore.targets import resolve_target
    from tunecore.workloads import extract_tasks, load_workload

    layout, _, algorithm = variant.partition("+")
    winograd = algorithm == "winograd"
    run = experiments.run_tunecore(path, args.trials, 0, search=args.search, cost_model=args.cost_model,
                                   store=f"sqlite:{store}", resume=True,
                                   extra_args=["--layout", layout] + (["--winograd"] if winograd else []))
    tasks = extract_tasks(load_workload(path, layout=layout, winograd=winograd), resolve_target("llvm"))
    flops = max(t.flops for t in tasks)
    convs = [t for t in tasks if "conv2d" in t.name and (winograd or t.flops == flops)]  # with its bias and relu
    best: dict = {"seconds": float("inf")}
    sqlite = SqliteStore(store)
    try:
        programs = {t.name: [r.candidate(t) for r in sqlite.best(t.task_id, k=args.remeasure)] for t in convs}
    finally:
        sqlite.close()
    for task in convs:
        passes = experiments.remeasure_passes(task, {"best": programs[task.name]}, passes=8)["best"]
        medians = [float(np.median(p)) for p in passes]
        i = int(np.argmin(medians))
        if medians[i] < best["seconds"]:
            best = {"seconds": medians[i], "passes_s": passes[i], "task": task.name}
    return {**best, "trials": run["measured"], "errors": run["errors"], "tuning_s": run["elapsed_total_s"]}


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--models", default="resnet-18,mobilenet-v2")
    parser.add_argument("--layouts", default="nchwc")
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--search", default="random")
    parser.add_argument("--cost-model", default="none")
    parser.add_argument("--remeasure", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", default=None, help="only convs whose name contains one of these (comma-separated), "
                                                     "e.g. '3x3s1 64->64'")
    parser.add_argument("--work", default="bench/results/conv_kernels-work")
    args = parser.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    os.makedirs(args.work, exist_ok=True)

    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    convs: dict[str, dict] = {}
    for model in (m.strip() for m in args.models.split(",") if m.strip()):
        for conv in distinct_convs(model):
            if not args.only or any(part in conv_name(conv) for part in args.only.split(",")):
                convs.setdefault(conv_name(conv), dict(conv, models=[]))["models"].append(model)
    rows = []
    for name, conv in convs.items():
        stem = os.path.join(args.work, name.replace(" ", "_").replace(">", ""))
        write_onnx(conv, stem + ".onnx")
        ort_s, ort_passes = onnxruntime_kernel_seconds(stem + ".onnx", conv, args.threads)
        row = {"conv": name, **conv, "gflop": flops(conv) / 1e9, "onnxruntime_s": ort_s,
               "onnxruntime_passes_s": ort_passes, "tunecore": {}}
        for layout in layouts:
            if layout.endswith("+winograd") and not name.startswith("3x3s1"):
                continue  # Winograd computes 3x3 stride-1 convs only
            row["tunecore"][layout] = tunecore_kernel_seconds(stem + ".onnx", layout, f"{stem}.{layout}.db", args)
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("conv", "onnxruntime_s")}
                         | {layout: r["seconds"] for layout, r in row["tunecore"].items()}), flush=True)
    report = {"command": command_line("conv_kernels.py"), "environment": environment(), "threads": args.threads,
              "trials": args.trials, "search": args.search, "cost_model": args.cost_model, "layouts": layouts,
              "convs": rows}
    write_results(args.out, "conv_kernels", report, markdown(report))


def _gflops(gflop: float, seconds: float, passes: list[float] | None) -> str:
    """GFLOPS at the median, with its min-max over the passes where there are any."""
    return f"{gflop / seconds:.1f}" + (f" ({gflop / max(passes):.0f}-{gflop / min(passes):.0f})" if passes else "")


def _cells(row: dict, result: dict | None) -> str:
    """GFLOPS (min-max over the passes) | ratio (the range pairing one side's slowest pass with the other's fastest)."""
    if not result:
        return "- | -"
    gflop, ort, own = row["gflop"], row.get("onnxruntime_passes_s"), result.get("passes_s")
    cell = _gflops(gflop, result["seconds"], own)
    return f"{cell} | {row['onnxruntime_s'] / result['seconds']:.2f}{ratio_range(ort, own)}"


def markdown(report: dict) -> str:
    layouts = report["layouts"]
    lines = ["# Conv kernels: tunecore against onnxruntime", "",
             f"{experiments.environment_line(report, report['threads'])} tunecore: {report['trials']} trials per "
             f"conv, search `{report['search']}`, cost model `{report['cost_model']}`; its best programs measured "
             "again together (8 passes). onnxruntime: the conv node's kernel time, profiled. Each conv with bias "
             "and relu; GFLOPS = 2 x multiply-adds / latency; ratio = onnxruntime's latency / tunecore's (> 1: "
             "tunecore faster). In brackets: the spread over 8 passes of each side (min-max of the pass "
             "medians; onnxruntime's profiled runs cut into 8 consecutive passes); a ratio's range pairs one side's "
             "slowest pass with the other's fastest, and only a range wholly above or below 1 is a difference.", "",
             "| conv | networks | GFLOP | onnxruntime GFLOPS | " + " | ".join(
                 f"tunecore {layout} GFLOPS | ratio" for layout in layouts) + " |",
             "|---|---|---:|---:|" + "---:|---:|" * len(layouts)]
    for row in report["convs"]:
        cells = [_cells(row, row["tunecore"].get(layout)) for layout in layouts]
        ort_cell = _gflops(row["gflop"], row["onnxruntime_s"], row.get("onnxruntime_passes_s"))
        lines.append(f"| {row['conv']} | {', '.join(row['models'])} | {row['gflop']:.3f} "
                     f"| {ort_cell} | " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
