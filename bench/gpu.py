"""tunecore on a GPU: searches against MetaSchedule on GPU operators, and a network tuned and compiled on the GPU
against PyTorch eager on the same GPU. Run on the GPU machine (TVM with its compiler: bench/gpu_device.sh).

    python bench/gpu.py ops [--ops matmul-1024,conv2d-resnet50-c2,dense-bert] [--trials 128] [--work DIR]
                            [--phase all|runs|remeasure]   # runs of several operators side by side, then remeasure
    python bench/gpu.py network [--model resnet-18] [--trials 400] [--work DIR]
    python bench/gpu.py network-export [--model resnet-18] --target JSON --store S --work DIR   # where TVM is
    python bench/gpu.py network-time DIR [DIR...]      # on the GPU machine, TVM's runtime alone
    python bench/gpu.py report --work DIR [DIR...]   # bench/results/gpu.{json,md}

`ops`: per operator, `tunecore run --target cuda` with ansor+xgb, tlm and random search, and MetaSchedule's
`tune_tir` (evolutionary, xgb), each the same number of trials, seed 0, its own process; then the 3 best
programs of every run re-measured together on the GPU (8 passes in random order, the median per program, the
best program's median per run; every program's outputs checked against the task's unscheduled program on the
host CPU). `network`: `tunecore run --model zoo:NET --target cuda`, then `tunecore compile` (tuned against TVM's
default GPU schedules, dlight; outputs compared) and PyTorch eager on the same GPU with the same weights
layout-free (torchvision-equivalent plain torch, bench/torch_nets.py), timed by CUDA events.
Each step is resumable: finished runs are kept in --work.
`network-export` / `network-time`: the same comparison where the GPU machine has no TVM compiler: the network is
built here with the store's best records and without (TVM's default GPU schedules), with the outputs of its
untuned build on the host CPU as the reference; there, both builds are loaded with TVM's runtime (their CUDA
compiled by the batch runner's callback), checked against that reference and timed beside PyTorch eager.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np

from tunecore import experiments
from tunecore.experiments import command_line, environment, write_results

OPS = ("matmul-1024", "conv2d-resnet50-c2", "dense-bert")
METHODS = {"ansor+xgb": ("ansor", "xgb"), "tlm": ("tlm", "none"), "random": ("random", "none")}
TOP_K = 3
LAUNCH_BOUND_S = 10e-6  # a GPU kernel shorter than this is timed mostly as its launch


def gpu_line() -> dict:
    """nvidia-smi's name, driver and memory, and the CUDA compiler's version."""
    def text(command: list[str]) -> str:
        try:
            return subprocess.run(command, capture_output=True, text=True, timeout=60).stdout.strip()
        except Exception as error:
            return f"unavailable ({error})"

    return {"nvidia_smi": text(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                "--format=csv,noheader"]),
            "nvcc": text(["nvcc", "--version"]).splitlines()[-1:],
            "cuda_driver_version": text(["nvidia-smi"]).split("CUDA Version:")[-1].split()[0:1]}


def gpu_name(gpu: dict) -> str:
    """The GPU's name in a ``gpu_line`` (what nvidia-smi said first, or that it was unavailable)."""
    return gpu.get("nvidia_smi", "").split(",")[0]


def ops(args) -> None:
    from tunecore.experiments import remeasure_together
    from tunecore.targets import resolve_target
    from tunecore.testing import tiny_task

    os.makedirs(args.work, exist_ok=True)
    with open(os.path.join(args.work, "gpu.json"), "w") as f:
        json.dump(gpu_line(), f)
    done_path = os.path.join(args.work, "runs.json")
    target = resolve_target(args.target)
    done = json.load(open(done_path)) if os.path.exists(done_path) else {}
    results = {}
    for op in args.ops.split(","):
        runs = {}
        for method in args.methods.split(","):
            key = f"{op} {method} {args.trials}"
            if args.phase == "remeasure" and key not in done:  # a run cut short by its call's deadline
                print(f"{key}: not run", file=sys.stderr, flush=True)
                continue
            if method == "metaschedule":
                work_dir = os.path.join(args.work, f"ms-{op}-{args.trials}")
                run = lambda: experiments.run_metaschedule(f"op:{op}", args.trials, 0, work_dir,  # noqa: E731
                                                           target=args.target)
            else:
                search, cost_model = METHODS[method]
                store = os.path.join(args.work, f"{method}-{op}-{args.trials}.db")
                run = lambda: {**experiments.run_tunecore(  # noqa: E731
                    f"op:{op}", args.trials, 0, search=search, cost_model=cost_model, store=f"sqlite:{store}",
                    extra_args=["--target", args.target]), "store": store}
            try:
                runs[method] = experiments.cached_run(done_path, key, run)
            except SystemExit as error:  # a run that fails is a result
                runs[method] = {"failed": str(error)[-2000:]}
            print(f"{key}: {json.dumps({k: v for k, v in runs[method].items() if k != 'tasks'})[:300]}",
                  file=sys.stderr, flush=True)
        if args.phase == "runs":
            continue
        task = tiny_task(op, target)
        programs = {m: experiments.best_programs(r, task, TOP_K) for m, r in runs.items() if "failed" not in r}
        best = remeasure_together(task, programs, passes=8) if programs else {}
        results[op] = {"gflop": task.flops / 1e9, "runs": {
            m: {**{k: v for k, v in r.items() if k in ("wall_s", "measured", "errors", "failed")},
                "best_s": best[m][0] if m in best and best[m] else None} for m, r in runs.items()}}
        print(f"{op}: " + ", ".join(f"{m} {v['best_s'] * 1e6:.1f} us" for m, v in results[op]["runs"].items()
                                    if v.get("best_s")), file=sys.stderr, flush=True)
    if args.phase == "runs":
        return
    with open(os.path.join(args.work, "ops.json"), "w") as f:
        json.dump({"trials": args.trials, "ops": results, "gpu": gpu_line(), "environment": environment(target)}, f,
                  indent=2)


def network(args) -> None:
    os.makedirs(args.work, exist_ok=True)
    store = os.path.join(args.work, f"{args.model}-{args.trials}.db")
    done_path = os.path.join(args.work, "runs.json")
    tuned = experiments.cached_run(done_path, f"{args.model} ansor+xgb {args.trials}", lambda: experiments.run_tunecore(
        f"zoo:{args.model}", args.trials, 0, search="ansor", cost_model="xgb", store=f"sqlite:{store}",
        extra_args=["--target", "cuda"]))
    compiled = subprocess.run([sys.executable, "-m", "tunecore.cli", "compile", "--model", f"zoo:{args.model}",
                               "--target", "cuda", "--store", store, "--json"], capture_output=True, text=True)
    report = {"model": args.model, "trials": args.trials, "tuning": {k: tuned[k] for k in ("wall_s", "measured",
                                                                                           "errors")}}
    if compiled.returncode == 0:
        report["compile"] = json.loads(compiled.stdout)
    else:
        report["compile_error"] = compiled.stderr[-2000:]
    try:
        report["pytorch_eager_ms"] = torch_eager_ms(args.model)
    except Exception as error:
        report["pytorch_error"] = f"{type(error).__name__}: {error}"
    with open(os.path.join(args.work, f"network-{args.model}.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2)[:3000], file=sys.stderr)


def network_export(args) -> None:
    from tvm.s_tir import meta_schedule as ms

    from tunecore import api
    from tunecore.compile import Runnable, best_database, build, input_specs, inputs_of, num_input
    from tunecore.targets import host_target, resolve_target
    from tunecore.workloads import extract_tasks, load_workload

    os.makedirs(args.work, exist_ok=True)
    workload, target = load_workload(f"zoo:{args.model}"), resolve_target(args.target)
    store = api.open_store(args.store, create=False)
    try:
        tasks = extract_tasks(workload, target)
        database, covered = best_database(store, tasks, target)
        best_ms = {t.name: r[0].latency * 1e3 for t in tasks if (r := store.best(t.task_id, k=1))}
    finally:
        store.close()
    build(workload, target, database).export_library(os.path.join(args.work, "tuned.so"))
    build(workload, target, ms.database.MemoryDatabase()).export_library(os.path.join(args.work, "untuned.so"))
    specs = input_specs(workload)
    cpu = Runnable(build(workload, host_target(), ms.database.MemoryDatabase()), workload, host_target(),
                   inputs_of(specs))
    np.savez(os.path.join(args.work, "reference.npz"), *cpu.outputs())
    with open(os.path.join(args.work, "network.json"), "w") as f:
        json.dump({"model": args.model, "specs": specs, "target": args.target, "kind": target.kind.name,
                   "store": args.store, "about": args.about, "num_input": num_input(workload),
                   "tasks_total": len(tasks), "tasks_tuned": covered, "records_best_ms": best_ms}, f, indent=1)
    print(f"{args.work}: {args.model} with {covered}/{len(tasks)} tasks tuned", file=sys.stderr)


def network_time(args) -> None:
    """Each network directory: tuned and untuned loaded with TVM's runtime, checked against the host CPU's outputs,
    then timed in alternating passes beside PyTorch eager (median and min-max of 8 passes)."""
    import tvm

    from tunecore.check import mismatch
    from tunecore.compile import Runnable, inputs_of
    from tunecore.measure.batch import Cubins, load_runtime_sidecars, use_cubins

    load_runtime_sidecars()
    for directory in args.directories:
        meta = json.load(open(os.path.join(directory, "network.json")))
        missing = {"kind", "specs", "num_input", "model"} - set(meta)
        if missing:  # written by an older network-export (the 2026-11-27 H100 call lost its network step to this)
            print(f"{directory}: network.json lacks {sorted(missing)}: run network-export again", file=sys.stderr)
            continue
        device = tvm.cpu(0) if meta["kind"] in ("llvm", "c") else tvm.device(meta["kind"], 0)
        if meta["kind"] == "cuda":
            use_cubins(Cubins(directory, "sm_" + device.compute_version.replace(".", "")))
        inputs = inputs_of([(tuple(s), d, n) for s, d, n in meta["specs"]])
        with np.load(os.path.join(directory, "reference.npz")) as saved:
            reference = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        report = {**meta, "gpu": gpu_line(), "specs": len(meta["specs"])}
        runs = {}
        for build in ("tuned", "untuned"):
            runs[build] = Runnable.network(tvm.runtime.load_module(os.path.join(directory, f"{build}.so")), device,
                                           inputs, meta["num_input"])
            error, wrong = mismatch(runs[build].outputs(), reference)
            report[f"{build}_against_cpu"] = {"max_relative_error": error, "wrong": wrong}
        passes: dict[str, list[float]] = {"tuned": [], "untuned": []}
        for _ in range(8):
            for build, run in runs.items():
                passes[build].append(run.time(5, 100) * 1e3)
        for build, values in passes.items():
            report[f"{build}_ms"] = {"median": float(np.median(values)), "min": min(values), "max": max(values)}
        try:
            report["pytorch_eager_ms"] = torch_eager_ms(meta["model"])
        except Exception as error:
            report["pytorch_error"] = f"{type(error).__name__}: {error}"
        with open(os.path.join(directory, f"network-time-{meta['model']}.json"), "w") as f:
            json.dump(report, f, indent=2)
        print(json.dumps(report, indent=1)[:3000], file=sys.stderr)


def torch_eager_ms(model: str) -> dict:
    """PyTorch eager on the GPU: median and min-max over 8 passes of the mean of 50 calls (CUDA events)."""
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_nets import MobileNetV2, ResNet18

    torch.manual_seed(0)
    net = {"resnet-18": ResNet18, "mobilenet-v2": MobileNetV2}[model]().eval().cuda()
    x = torch.rand(1, 3, 224, 224, device="cuda")
    passes = []
    with torch.inference_mode():
        for _ in range(10):
            net(x)
        for _ in range(8):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(50):
                net(x)
            end.record()
            torch.cuda.synchronize()
            passes.append(start.elapsed_time(end) / 50)
    return {"median": float(np.median(passes)), "min": min(passes), "max": max(passes),
            "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}


def report(args) -> None:
    """Merge the work directories' results (with ``gpu.json``, the device line ``ops`` writes) and the GPU
    dataset's counts."""
    merged: dict = {"benchmark": "gpu", "ops": {}, "during_runs": {}, "networks": {}, "command": command_line("gpu.py")}
    if args.previous:  # an earlier session's results, kept where this one did not run them again
        previous = json.load(open(args.previous))
        for key in ("ops", "during_runs", "networks", "networks_runtime_only"):
            merged[key] = previous.get(key, {}) or {}
        merged["previous"] = {"command": previous.get("command"), "gpu": previous.get("gpu")}
        merged["gpu"] = previous.get("gpu", {})  # the same GPU kind: the runs of this report say so beside it
    for work in args.work_dirs:
        here = os.path.join(work, "gpu.json")
        timed = [json.load(open(os.path.join(work, name))) for name in sorted(os.listdir(work))
                 if name.startswith("network-time-") and name.endswith(".json")]  # a network directory's
        ran_on = json.load(open(here)) if os.path.exists(here) else next((t["gpu"] for t in timed), None)
        if ran_on is not None and merged.get("gpu") and gpu_name(ran_on) != gpu_name(merged["gpu"]):
            print(f"gpu.py report: {work} ran on {gpu_name(ran_on)!r}, the report's other runs on "
                  f"{gpu_name(merged['gpu'])!r}: one report per GPU (another --out, without --previous)",
                  file=sys.stderr)
            raise SystemExit(2)
        path = os.path.join(work, "ops.json")
        if os.path.exists(path):
            data = json.load(open(path))
            merged.update(trials=data["trials"], gpu=data["gpu"], environment=data["environment"])
            merged["ops"].update(data["ops"])
        if ran_on is not None:
            merged["gpu"] = ran_on
        if os.path.exists(os.path.join(work, "runs.json")):  # each run's own best, also of runs not re-measured
            for key, run in json.load(open(os.path.join(work, "runs.json"))).items():
                if key == experiments.MADE_ON:
                    continue
                merged["during_runs"][key] = {k: run.get(k) for k in ("wall_s", "measured", "errors",
                                                                         "best_latency_s")}
        for data in timed:
            key = f"{data['model']} ({data['about']})" if data.get("about") else data["model"]
            merged.setdefault("networks_runtime_only", {})[key] = data
        for name in os.listdir(work):
            if name.startswith("network-") and not name.startswith("network-time-") and name.endswith(".json"):
                data = json.load(open(os.path.join(work, name)))
                merged["networks"][data["model"]] = data
    if args.dataset and os.path.exists(args.dataset):
        merged["dataset"] = dataset_summary(args.dataset)
    write_results(args.out, "gpu", merged, markdown(merged))


def dataset_summary(path: str) -> dict:
    from tunecore.dataset import Dataset
    from tunecore.dataset.protocol import is_clean

    dataset = Dataset.load(path)
    profiled = [r for r in dataset.rows if any(k.startswith("ncu.") and k != "ncu.failed" for k in r.profile)]
    checked = [r for r in dataset.rows if "check.max_relative_error" in r.profile and r.error is None]
    per_task: dict = {}
    for row in dataset.rows:
        per_task.setdefault(dataset.tasks[row.task_key].name, []).append(row)
    from label_noise import errors  # the repeat error as the label-noise bench defines it

    from tunecore.dataset.protocol import BUILD_OVERLAP, SECOND_LABEL

    first, second = (np.array([(r.latency, r.profile[SECOND_LABEL]) for r in dataset.rows
                               if SECOND_LABEL in r.profile]).reshape(-1, 2).T)
    repeat = errors(first, second)
    if repeat:
        repeat["max_ape"] = float((np.abs(second - first) / first).max())
        # a kernel of a few microseconds is mostly its launch, which differs between sessions' hosts
        short = first < LAUNCH_BOUND_S
        repeat["launch_bound"] = errors(first[short], second[short])
        repeat["longer"] = errors(first[~short], second[~short])
    return {"path": os.path.relpath(path, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
            "second_labels": repeat, "build_overlap": sum(BUILD_OVERLAP in r.profile for r in dataset.rows),
            "rows": len(dataset.rows), "failed": sum(r.error is not None for r in dataset.rows),
            "clean": sum(map(is_clean, dataset.rows)), "with_ncu_profile": len(profiled),
            "outputs_checked": len(checked),
            "max_relative_error": max((r.profile["check.max_relative_error"] for r in checked), default=None),
            "tasks": len(dataset.tasks), "devices": list(dataset.devices.values()),
            "programs_per_task": {name: len(rows) for name, rows in sorted(per_task.items())}}


def markdown(report: dict) -> str:
    lines = ["# tunecore on a GPU", ""]
    gpu = report.get("gpu", {})
    lines += [f"Device: {gpu.get('nvidia_smi', '?')}; CUDA {''.join(gpu.get('cuda_driver_version', []))}; "
              f"{''.join(gpu.get('nvcc', []))}.", ""]
    if report["ops"]:
        methods = sorted({m for op in report["ops"].values() for m in op["runs"]})
        lines += [f"## Operators: {report.get('trials')} trials each, seed 0", "",
                  "Best latency: the 3 best programs of each run re-measured together (median of 8 passes in "
                  "random order, outputs checked); GFLOP/s in brackets.", "",
                  "| operator | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
        for op, data in report["ops"].items():
            cells = []
            for m in methods:
                run = data["runs"].get(m, {})
                best = run.get("best_s")
                cells.append(f"{best * 1e6:.1f} us ({data['gflop'] / best:.0f})" if best else
                             ("failed" if run.get("failed") else "-"))
            lines.append(f"| {op} | " + " | ".join(cells) + " |")
        lines += ["", "| operator | " + " | ".join(f"{m} wall s" for m in methods) + " |",
                  "|---|" + "---|" * len(methods)]
        for op, data in report["ops"].items():
            lines.append(f"| {op} | " + " | ".join(
                f"{data['runs'][m]['wall_s']:.0f}" if data["runs"].get(m, {}).get("wall_s") else "-"
                for m in methods) + " |")
    if report.get("during_runs"):
        lines += ["", "## Each run's own best (latency measured during the run, not re-measured together)", "",
                  "| run | trials measured | errors | best | wall s |", "|---|---:|---:|---:|---:|"]
        for key, run in report["during_runs"].items():
            best = run.get("best_latency_s")
            lines.append(f"| {key} | {run.get('measured', '-')} | {run.get('errors', '-')} | "
                         f"{f'{best * 1e6:.1f} us' if best else 'none'} | {run.get('wall_s') or 0:.0f} |")
    if report.get("dataset"):
        d = report["dataset"]
        lines += ["", f"## The GPU dataset: `{d['path']}`", "",
                  f"{d['rows']} programs ({d['failed']} failed to build), {d['clean']} clean (>= 5 timings within "
                  f"2%), {d['with_ncu_profile']} with Nsight Compute profiles, {d['outputs_checked']} outputs "
                  f"checked against the host CPU (max relative error {d['max_relative_error']:.2g}); "
                  f"{d['tasks']} tasks.", ""]
        if d.get("build_overlap"):
            lines += [f"{d['build_overlap']} rows were timed while the host compiled CUDA beside the timing "
                      "(`label.build_overlap`, not clean): the launches of short kernels slow down on a busy host "
                      "(docs/gpu.md).", ""]
        if d.get("second_labels"):
            r = d["second_labels"]
            lines += [f"Second labels (the same program timed again in another session): {r['programs']} programs, "
                      f"repeat MAPE {r['mape'] * 100:.2f}% (median {r['median_ape'] * 100:.2f}%, p90 "
                      f"{r['p90_ape'] * 100:.2f}%, max {r['max_ape'] * 100:.2f}%)."]
            for key, what in (("longer", f">= {LAUNCH_BOUND_S * 1e6:.0f} us"),
                              ("launch_bound", f"< {LAUNCH_BOUND_S * 1e6:.0f} us (launch-bound)")):
                if r.get(key):
                    lines.append(f"- kernels {what}: {r[key]['programs']} programs, repeat MAPE "
                                 f"{r[key]['mape'] * 100:.2f}% (median {r[key]['median_ape'] * 100:.2f}%, p90 "
                                 f"{r[key]['p90_ape'] * 100:.2f}%), second/first median "
                                 f"{r[key]['median_ratio']:.3f}")
            lines.append("")
        lines += ["| task | programs |", "|---|---:|"]
        lines += [f"| {name} | {n} |" for name, n in d["programs_per_task"].items()]
    for model, data in report["networks"].items():
        lines += ["", f"## {model}: tuned on the GPU ({data['trials']} trials of ansor+xgb)", ""]
        c = data.get("compile")
        if c:
            eager = data.get("pytorch_eager_ms", {})
            lines += [f"- tuned: {c['latency_ms']:.3f} ms; TVM's default GPU schedules (dlight): "
                      f"{c['untuned_latency_ms']:.3f} ms; outputs match: {c['outputs_match']} "
                      f"(max relative error {c['max_relative_error']:.2g}); {c['tasks_tuned']}/{c['tasks_total']} "
                      "tasks tuned",
                      f"- PyTorch eager on the same GPU: {eager.get('median', float('nan')):.3f} ms "
                      f"(min-max {eager.get('min', float('nan')):.3f}-{eager.get('max', float('nan')):.3f}; "
                      f"torch {eager.get('torch', '?')})"]
        else:
            lines.append(f"- compile failed: {data.get('compile_error', '')[-500:]}")
    for data in report.get("networks_runtime_only", {}).values():
        lines += ["", f"## {data['model']}: {data.get('about') or 'built on the CPU machine'}, run on the GPU with "
                  "TVM's runtime alone", "",
                  f"Schedules: the best record of each task in `{data['store']}` ({data['tasks_tuned']}/"
                  f"{data['tasks_total']} tasks), each measured on this GPU; untuned: TVM's default GPU schedules "
                  "(dlight). Outputs against the untuned build's on the host CPU, same seeded inputs and weights. "
                  "Median of 8 alternating passes (min-max); each pass the median of 5 timings of >= 100 ms. "
                  "PyTorch eager: the same architecture (bench/torch_nets.py), its own random weights, CUDA events, "
                  "median of 8 passes of 50 calls.", "",
                  "| build | ms | min-max | vs PyTorch eager | outputs vs CPU (max rel. error) |",
                  "|---|---:|---:|---:|---|"]
        eager = data.get("pytorch_eager_ms", {}).get("median")
        for build in ("tuned", "untuned"):
            t, check = data[f"{build}_ms"], data[f"{build}_against_cpu"]
            ratio = f"{t['median'] / eager:.2f}x" if eager else "-"
            lines.append(f"| {build} | {t['median']:.3f} | {t['min']:.3f}-{t['max']:.3f} | {ratio} | "
                         f"{'match' if check['wrong'] is None else 'DIFFER'} ({check['max_relative_error']:.2g}) |")
        if eager:
            e = data["pytorch_eager_ms"]
            lines.append(f"| PyTorch eager (torch {e['torch']}) | {e['median']:.3f} | {e['min']:.3f}-{e['max']:.3f} "
                         "| 1.00x | - |")
        else:
            lines.append(f"| PyTorch eager | failed: {data.get('pytorch_error', '')[:200]} | | | |")
    lines += ["", f"Command: `{report['command']}`", ""]
    return "\n".join(lines)


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    sub = parser.add_subparsers(dest="step", required=True)
    o = sub.add_parser("ops")
    o.add_argument("--ops", default=",".join(OPS))
    o.add_argument("--methods", default="ansor+xgb,tlm,random,metaschedule")
    o.add_argument("--trials", type=int, default=128)
    o.add_argument("--work", default="/tmp/tunecore-bench-gpu")
    o.add_argument("--target", default="cuda", help="(llvm: to try the script on a CPU machine)")
    o.add_argument("--phase", choices=("all", "runs", "remeasure"), default="all",
                   help="runs: the searches only (several operators side by side); remeasure: only the best "
                        "programs of the runs already done, measured together (one operator at a time, GPU idle)")
    n = sub.add_parser("network")
    n.add_argument("--model", default="resnet-18", choices=("resnet-18", "mobilenet-v2"))
    n.add_argument("--trials", type=int, default=400)
    n.add_argument("--work", default="/tmp/tunecore-bench-gpu")
    e = sub.add_parser("network-export")
    e.add_argument("--model", default="resnet-18", choices=("resnet-18", "mobilenet-v2"))
    e.add_argument("--target", required=True, help="the GPU's target (a JSON target, as the batches use)")
    e.add_argument("--store", required=True, help="records measured on that GPU")
    e.add_argument("--work", required=True, help="the directory to write (then carried to the GPU machine)")
    e.add_argument("--about", default="", help="where the store's records came from, for the report")
    t = sub.add_parser("network-time")
    t.add_argument("directories", nargs="+")
    r = sub.add_parser("report")
    r.add_argument("work_dirs", nargs="+")
    r.add_argument("--previous", default=None,
                   help="an earlier gpu.json: its tables are kept where these work dirs do not have them")
    r.add_argument("--dataset", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                     "datasets", "gpu-h100.parquet"))
    args = parser.parse_args()
    started = time.time()
    {"ops": ops, "network": network, "network-export": network_export, "network-time": network_time,
     "report": report}[args.step](args)
    print(f"{args.step}: {time.time() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
