"""End to end: the same networks run by PyTorch, onnxruntime, TVM untuned, and TVM tuned by tunecore and by
MetaSchedule for the same time.

One definition per network: ResNet-18 / MobileNetV2 in plain torch (bench/torch_nets.py), transformers'
BERT-base (sequence length 128), or a CNN of the model corpus (tunecore/workloads/corpus.py: ResNeXt's grouped
convs, ConvNeXt's depthwise 7x7 convs and layer norms), with seeded random weights, exported to ONNX. PyTorch
runs the module (eager, and `torch.compile` where it works here); onnxruntime and TVM run the ONNX
file. tunecore tunes it with `tunecore run --model NET.onnx --time-budget T` and MetaSchedule with its own
`tune_relax` on the same tasks for the same wall time T, or for its own (``--ms-time-budget``: its first pass
over a CNN's tasks may need more than tunecore's) (each a child process; MetaSchedule's is stopped at its
time, its database keeps what it committed); both are built the same way, as `tunecore compile` builds.
Every variant's output is checked against PyTorch's; all variants use the target's core count as threads
and are timed in one process, in alternating passes (a pass: calls for at least 0.3 s, median), the latency
is the median over passes. Then, for tunecore's build, where the time goes per layer (bench/e2e_gap.py).

    .venv/bin/pip install -e ".[e2e]" transformers   # torch==2.13.0, onnxruntime; transformers: bert-base, convnext
    python bench/e2e.py [--models resnet-18,mobilenet-v2,bert-base,resnext,convnext] [--time-budget 30m]
                        [--ms-time-budget 45m] [--trials N] [--layout nchwc] [--winograd]

Resumable: the ONNX files, stores, MetaSchedule databases and tuning times are kept in --work; an
interrupted tuning resumes with the time it has left. Writes bench/results/e2e.{json,md}.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import tempfile
from typing import Any, Callable

import e2e_gap
import numpy as np

from tunecore import experiments
from tunecore.cli.args import duration
from tunecore.errors import first_line
from tunecore.experiments import command_line, environment, ratio_range, write_results

NETWORKS = ("resnet-18", "mobilenet-v2", "bert-base", "resnext", "convnext")
CORPUS_CNNS = ("resnext", "convnext")  # tunecore.workloads.corpus


def network(name: str) -> tuple[Any, np.ndarray]:
    """The torch module (seeded random weights, eval mode) and an input for it."""
    import torch

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    if name in ("resnet-18", "mobilenet-v2"):
        from torch_nets import MobileNetV2, ResNet18

        build = {"resnet-18": ResNet18, "mobilenet-v2": MobileNetV2}[name]
        return build().eval(), rng.uniform(-1, 1, (1, 3, 224, 224)).astype("float32")
    if name == "bert-base":  # sequence length 128, as in the zoo
        import transformers

        class Bert(torch.nn.Module):  # the last hidden state as one tensor, for ONNX and comparison
            def __init__(self) -> None:
                super().__init__()
                self.bert = transformers.BertModel(transformers.BertConfig(), add_pooling_layer=False)

            def forward(self, input_ids: Any) -> Any:
                return self.bert(input_ids=input_ids).last_hidden_state

        return Bert().eval(), rng.integers(0, 30522, (1, 128)).astype("int64")
    if name in CORPUS_CNNS:
        from tunecore.workloads.corpus import factory

        module, (image,) = factory(name)
        return module, image.numpy()
    raise ValueError(f"unknown network {name!r}")  # main() checked --models


def export_onnx(model: Any, example: Any, path: str) -> None:
    from tunecore.workloads.corpus import export_onnx as export

    if not os.path.exists(path):
        export(model, (example,), ("input",), (), path)


def tune(onnx_path: str, store: str, search: str, cost_model: str, trials: int | None, seconds: float | None,
         done_path: str, layout: str, winograd: bool, options: list[str]) -> dict:
    key = f"{onnx_path} {search} {cost_model} {trials} {seconds}" + (f" {layout}" if layout != "nchw" else "") + (
        " winograd" if winograd else "") + "".join(f" {o}" for o in options)
    extra = ["--layout", layout] + (["--winograd"] if winograd else []) + [
        arg for option in options for arg in ("-O", option)]
    return experiments.cached_run(done_path, key,
                                  lambda: experiments.run_tunecore(onnx_path, trials, 0, search=search,
                                                                   cost_model=cost_model, store=f"sqlite:{store}",
                                                                   time_budget=seconds, resume=True,
                                                                   extra_args=extra))


def tune_metaschedule(onnx_path: str, work_dir: str, seconds: float, trials_per_iter: int, done_path: str,
                      layout: str) -> dict:
    key = f"{onnx_path} metaschedule {seconds}" + (f" {trials_per_iter}/iter" if trials_per_iter != 64 else "") + (
        f" {layout}" if layout != "nchw" else "")
    return experiments.cached_run(done_path, key, lambda: experiments.run_metaschedule_for(
        onnx_path, seconds, 0, work_dir, trials_per_iter, layout))


def variants(name: str, model: Any, x: np.ndarray, onnx_path: str, store: str, ms_work_dir: str | None,
             threads: int, layout: str, winograd: bool, other_stores: dict[str, str]) -> dict[str, Callable]:
    """name -> a function running one inference and returning the output as numpy (or raising);
    ``other_stores``: label -> another tunecore store of this network, built and timed beside."""
    import onnxruntime as ort
    import torch
    from tvm.s_tir import meta_schedule as ms

    from tunecore.compile import Runnable, build
    from tunecore.targets import resolve_target
    from tunecore.workloads import extract_tasks, load_workload

    torch.set_num_threads(threads)
    tx = torch.from_numpy(x)
    out: dict[str, Callable] = {}

    def eager() -> np.ndarray:
        with torch.inference_mode():
            return model(tx).numpy()

    out["pytorch eager"] = eager
    try:
        compiled = torch.compile(model)
        with torch.inference_mode():
            compiled(tx)  # compiles here, outside the timing

        def run_compiled() -> np.ndarray:
            with torch.inference_mode():
                return compiled(tx).numpy()

        out["pytorch torch.compile"] = run_compiled
    except Exception as error:
        out["pytorch torch.compile"] = _failing(f"{type(error).__name__}: {first_line(error, 200)}")

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
    out["onnxruntime"] = lambda: session.run(None, {"input": x})[0]

    target = resolve_target("llvm")
    workload = load_workload(onnx_path, layout=layout, winograd=winograd)
    tasks = functools.cache(lambda: extract_tasks(workload, target))  # inside a build: its failure is a result
    builds = {"tvm untuned": lambda: (build(workload, target, ms.database.MemoryDatabase()), None),
              "tvm tuned by tunecore": lambda: experiments.build_from_store(workload, tasks(), target, store)}
    for label, path in other_stores.items():
        builds[f"tvm tuned by tunecore, {label}"] = lambda p=path: experiments.build_from_store(workload, tasks(),
                                                                                               target, p)
    if ms_work_dir:
        builds["tvm tuned by MetaSchedule"] = lambda: (
            build(workload, target, ms.database.JSONDatabase(work_dir=ms_work_dir)), None)
    for label, make in builds.items():
        try:  # a build that fails is a result of the benchmark
            executable, covered = make()
        except Exception as error:
            out[label] = _failing(f"{type(error).__name__}: {first_line(error, 200)}")
            continue
        runnable = Runnable(executable, workload, target, [x])
        out[label if covered is None else f"{label} ({covered} tasks)"] = lambda r=runnable: r.outputs()[0]
    return out


def _failing(message: str) -> Callable:
    def run() -> np.ndarray:
        raise RuntimeError(message)
    return run


def check_and_time(functions: dict[str, Callable], reference: np.ndarray, passes: int) -> dict[str, dict]:
    from tunecore.check import max_relative_error

    results: dict[str, dict] = {}
    for name, f in functions.items():
        try:
            results[name] = {"max_relative_error": max_relative_error([f()], [reference])}
        except Exception as e:
            results[name] = {"error": str(e)}
    live = {name: f for name, f in functions.items() if "error" not in results[name]}
    timers = {name: lambda f=f: experiments.median_call_seconds(f) for name, f in live.items()}
    samples = experiments.passes_together(timers, passes)
    for name, seconds in samples.items():
        results[name]["passes_ms"] = [s * 1e3 for s in seconds]
        results[name]["latency_ms"] = float(np.median(results[name]["passes_ms"]))
    return results


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--models", default="resnet-18,mobilenet-v2")
    parser.add_argument("--search", default="ansor")
    parser.add_argument("--cost-model", default="xgb")
    parser.add_argument("--time-budget", type=duration, default=1800.0, metavar="DURATION",
                        help="tuning time per network for each tuner (default: 30m)")
    parser.add_argument("--ms-time-budget", type=duration, default=None, metavar="DURATION",
                        help="MetaSchedule's tuning time per network (default: --time-budget)")
    parser.add_argument("--trials", type=int, default=None, help="also stop tunecore at this many trials")
    parser.add_argument("--tuners", default="tunecore,metaschedule")
    parser.add_argument("--ms-trials-per-iter", type=int, default=64, metavar="N",
                        help="MetaSchedule's candidates per task per iteration (default: its own, 64); it commits a "
                             "task's results only when it comes back to the task, so short budgets need fewer")
    parser.add_argument("--layout", default="nchw", help="the layout both tuners tune and build the CNNs in")
    parser.add_argument("--winograd", action="store_true",
                        help="tunecore tunes Winograd kernels beside the direct ones for the CNNs' 3x3 stride-1 convs "
                             "and keeps the faster (tunecore run --winograd); MetaSchedule tunes the direct ones")
    parser.add_argument("--tunecore-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an -O option for tunecore's tuning, e.g. measurer.cpu_cache_flush=true (repeatable; "
                             "a tuning of its own)")
    parser.add_argument("--compare-store", action="append", default=[], metavar="LABEL=PATH",
                        help="another tunecore store of the (one) network, e.g. a tuning with other options, built "
                             "and timed beside the others as 'tvm tuned by tunecore, LABEL' (repeatable)")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "tunecore-bench-e2e"))
    args = parser.parse_args()
    models = args.models.split(",")
    tuners = args.tuners.split(",")
    if not set(tuners) <= {"tunecore", "metaschedule"}:
        parser.error(f"--tuners: tunecore and/or metaschedule, not {args.tuners!r}")
    unknown = [m for m in models if m not in NETWORKS]
    if unknown:
        parser.error(f"--models: unknown network {unknown[0]!r}; known: {', '.join(NETWORKS)}")
    other_stores = dict(s.split("=", 1) for s in args.compare_store if "=" in s)
    if len(other_stores) < len(args.compare_store) or any(not os.path.isfile(p) for p in other_stores.values()):
        parser.error(f"--compare-store: LABEL=PATH of an existing store, not {args.compare_store!r}")
    if other_stores and len(models) > 1:
        parser.error("--compare-store: with one network in --models")
    needs_transformers = {"bert-base", "convnext"} & set(models)
    missing = [m for m in ("torch", "onnxruntime", *(["transformers"] if needs_transformers else []))
               if importlib.util.find_spec(m) is None]
    if missing:
        parser.error(f"needs {', '.join(missing)}: pip install -e \".[e2e]\""
                     + (" transformers" if "transformers" in missing else ""))

    import torch

    from tunecore.targets import resolve_target, use_target_threads

    threads = use_target_threads(resolve_target("llvm"))
    ms_seconds = args.ms_time_budget or args.time_budget
    os.makedirs(args.work, exist_ok=True)
    done_path = os.path.join(args.work, "tuning.json")
    networks = {}
    for name in models:
        model, x = network(name)
        onnx_path = os.path.join(args.work, f"{name}.onnx")
        export_onnx(model, torch.from_numpy(x), onnx_path)
        layout = args.layout if name != "bert-base" else "nchw"  # bert has no conv
        winograd = args.winograd and name != "bert-base"
        label = f"{name}-{args.search}-{args.cost_model}-{args.time_budget:g}s" + (
            f"-{args.trials}" if args.trials else "") + (f"-{layout}" if layout != "nchw" else "") + (
            "-winograd" if winograd else "") + "".join(f"-{o}" for o in args.tunecore_option)
        store = os.path.join(args.work, f"{label}.db")
        ms_work_dir = os.path.join(args.work, f"{name}-metaschedule-{ms_seconds:g}s" + (
            f"-{args.ms_trials_per_iter}" if args.ms_trials_per_iter != 64 else "") + (
            f"-{layout}" if layout != "nchw" else ""))
        tuning = {}
        if "tunecore" in tuners:
            tuning["tunecore"] = tune(onnx_path, store, args.search, args.cost_model, args.trials, args.time_budget,
                                      done_path, layout, winograd, args.tunecore_option)
        if "metaschedule" in tuners:
            tuning["MetaSchedule"] = tune_metaschedule(onnx_path, ms_work_dir, ms_seconds,
                                                       args.ms_trials_per_iter, done_path, layout)
        functions = variants(name, model, x, onnx_path, store, ms_work_dir if "metaschedule" in tuners else None,
                             threads, layout, winograd, other_stores)
        with torch.inference_mode():
            reference = model(torch.from_numpy(x)).numpy()
        print(f"timing {name} ...", file=sys.stderr, flush=True)
        networks[name] = {"tuning": tuning, "variants": check_and_time(functions, reference, args.passes)}
        del functions
        if "tunecore" in tuners:
            networks[name]["gap"] = e2e_gap.analyse(onnx_path, store, runs=10, layout=layout, winograd=winograd)

    report = {"benchmark": "e2e", "search": args.search, "cost_model": args.cost_model, "trials": args.trials,
              "time_budget_s": args.time_budget, "ms_time_budget_s": ms_seconds,
              "ms_trials_per_iter": args.ms_trials_per_iter, "layout": args.layout, "winograd": args.winograd,
              "tunecore_options": args.tunecore_option, "compare_stores": other_stores,
              "threads": threads, "passes": args.passes, "networks": networks, "environment": environment(),
              "versions": _versions(), "command": command_line("e2e.py")}
    write_results(args.out, "e2e", report, markdown(report))


def _versions() -> dict[str, str]:
    import importlib.metadata

    versions = {}
    for d in ("torch", "onnxruntime", "transformers"):
        try:
            versions[d] = importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def _min_max(v: dict) -> str:
    passes = v.get("passes_ms")
    return f"{min(passes):.2f}-{max(passes):.2f}" if passes else "-"


def _ratio_spread(reference: dict, v: dict) -> str:
    """' (low-high)' of reference / v over the two variants' passes, or '' without passes."""
    return "" if reference is v else ratio_range(reference.get("passes_ms"), v.get("passes_ms"))


def markdown(report: dict) -> str:
    env = report["environment"]
    budget = f"{report['time_budget_s'] / 60:g} min"
    lines = [f"# End to end: {', '.join(report['networks'])}", "",
             f"CPU: {env['cpu']}, {report['threads']} threads for every variant; TVM {env['versions']['apache-tvm']}, "
             + ", ".join(f"{k} {v}" for k, v in report["versions"].items()) + f". Command: `{report['command']}`.", "",
             f"Each network tuned on the ONNX export for **{budget}** of wall time by tunecore "
             f"`--search {report['search']} --cost-model {report['cost_model']} "
             f"--time-budget {report['time_budget_s']:g}`"
             + (f" `--trials {report['trials']}`" if report["trials"] else "")
             + "".join(f" `-O {o}`" for o in report.get("tunecore_options", []))
             + (f", the CNNs' convs in layout `{report['layout']}` for both tuners"
                if report.get("layout", "nchw") != "nchw" else "")
             + (", tunecore with Winograd kernels beside the direct ones for their 3x3 stride-1 convs (`--winograd`: "
                "the faster kept per conv)" if report.get("winograd") else "")
             + f"; MetaSchedule's `tune_relax` (evolutionary, xgb, {report.get('ms_trials_per_iter', 64)} per "
             "iteration, builder timeout "
             f"{experiments.BUILDER_TIMEOUT_S} s) on the same tasks, stopped at "
             f"{report.get('ms_time_budget_s', report['time_budget_s']) / 60:g} min. Both built as `tunecore "
             f"compile` builds (weights pre-packed). Latency: median of {report['passes']} alternating passes, all "
             "variants in one process; outputs checked against PyTorch eager."
             + "".join(f" 'tvm tuned by tunecore, {label}': the build of another tunecore store, `{path}`."
                       for label, path in report.get("compare_stores", {}).items()), "",
             "Spread: each variant's fastest and slowest pass (min-max ms). A ratio's range in brackets pairs the "
             "other's slowest pass with this variant's fastest, and the other's fastest with this one's slowest; "
             "only a range wholly above 1.00x (this variant faster) or wholly below it (slower) is a difference "
             "beyond the passes' spread, otherwise the two are level.", "",
             "| network | variant | ms | min-max ms | vs PyTorch eager | vs onnxruntime | max rel. error vs PyTorch |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name, net in report["networks"].items():
        eager_v = net["variants"]["pytorch eager"]
        ort_v = net["variants"].get("onnxruntime", {})
        eager, ort = eager_v.get("latency_ms"), ort_v.get("latency_ms")
        for variant, v in net["variants"].items():
            if "error" in v:
                lines.append(f"| {name} | {variant} | failed: {v['error']} | - | - | - | - |")
                continue
            versus_ort = f"{ort / v['latency_ms']:.2f}x{_ratio_spread(ort_v, v)}" if ort else "-"
            lines.append(f"| {name} | {variant} | {v['latency_ms']:.2f} | {_min_max(v)} "
                         f"| {eager / v['latency_ms']:.2f}x{_ratio_spread(eager_v, v)} "
                         f"| {versus_ort} | {v['max_relative_error']:.1g} |")
        for tuner, t in net["tuning"].items():
            lines.append(f"| {name} | (tuning by {tuner}: {t['measured']} trials, {t['errors']} failed, "
                         f"{t.get('elapsed_total_s', t['wall_s']):.0f} s) | | | | | |")
    lines.append("")
    for name, net in report["networks"].items():
        if "gap" in net:
            lines += [f"## {name}: where tunecore's build spends its time (bench/e2e_gap.py)", "",
                      *e2e_gap.summary_lines(net["gap"]), *e2e_gap.layer_lines(net["gap"], limit=12)]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
