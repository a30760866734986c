"""`tunecore predict --measure` on networks cdmpp never saw: its end-to-end estimate against the measured latency.

Per network (default: the shipped cdmpp weights' held-out resnet-18, mobilenet-v2, bert-tiny), on this CPU at
`--cores` threads (default 1: the device the shipped weights were trained on is this CPU model at one core):

1. `tunecore run --search ansor --cost-model xgb --trials N`: a tuned store, as a user has before predicting.
2. `tunecore predict --measure --json` with that store (each task's best program), and with an empty store
   (each task as TVM compiles it untuned), `--passes` times each: the prediction, and the measured latency.

Error = |predicted - measured| / measured, against each pass's measurement (min-max over passes). Beside cdmpp:

- tasks' own timings (ceiling): the sum over tasks of weight x the best latency tuning measured for it, what a
  perfect per-task predictor would give with CDMPP's estimator (which counts no work between tasks);
- FLOPs constant (floor): the sum over tasks of weight x FLOPs x the median seconds per FLOP of this device's
  programs in the dataset, the held-out networks' programs left out; one guess per task from its size alone.

    python bench/predict.py [--networks resnet-18,mobilenet-v2,bert-tiny] [--trials 256] [--cores 1]
                            [--passes 2] [--weights shipped|FILE] [--dataset datasets/cpu-programs-v2.parquet]

Tuning runs are cached in bench/results/predict-work/ (delete it to start over); results in
bench/results/predict.{json,md}.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from tunecore import experiments
from tunecore.experiments import cached_run, command_line, environment, environment_line, run_tunecore, write_results


def predicted(model: str, target: str, store: str, weights: str) -> dict:
    """`tunecore predict --measure --json` in a child process, as a user runs it."""
    _, out = experiments.run_timed([sys.executable, "-m", "tunecore.cli", "predict", "--model", model, "--target",
                                    target, "--store", store, "--cost-model", "cdmpp", "-O",
                                    f"cdmpp.weights={weights}", "--measure", "--json"])
    return json.loads(out)


def fast_end(dataset, device: str, networks: set[str], model) -> dict:
    """cdmpp's prediction over the measurement on the networks' dataset programs of this device (geometric mean):
    over all of them, and over each task's fastest, the program a tuned network is made of."""
    from tunecore.dataset.evaluate import measured_groups

    rows = [r for r in dataset.rows if r.latency is not None and r.device_id == device
            and networks & set(dataset.tasks[r.task_key].workloads)]
    every, fastest = [], []
    for task, candidates, results, description in measured_groups(dataset, rows):
        model.device = description
        log_ratio = np.log(np.asarray(model.predict_latency(task, candidates), dtype=float)
                           / np.array([r.latency for r in results]))
        every += list(log_ratio)
        fastest.append(log_ratio[int(np.argmin([r.latency for r in results]))])
    return {"programs": len(every), "tasks": len(fastest), "all": float(np.exp(np.mean(every))),
            "fastest": float(np.exp(np.mean(fastest))), "fastest_median": float(np.exp(np.median(fastest)))}


def flops_estimate_ms(model: str, target, per_flop: float) -> float:
    from tunecore.workloads import extract_tasks, load_workload

    return 1e3 * sum(task.weight * task.flops * per_flop for task in extract_tasks(load_workload(model), target))


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--networks", default="resnet-18,mobilenet-v2,bert-tiny")
    parser.add_argument("--trials", type=int, default=256)
    parser.add_argument("--cores", type=int, default=1)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--weights", default="shipped", help="cdmpp's weights: shipped (default) or a file")
    parser.add_argument("--dataset", default="datasets/cpu-programs-v2.parquet")
    args = parser.parse_args()
    import tvm
    from tunecore_cdmpp_predictor.costmodel import CDMPPModel

    from tunecore.targets import device_descriptor, device_id, host_target
    from tunecore.tvmjson import target_to_json

    target = tvm.target.Target({**json.loads(target_to_json(host_target())), "num-cores": args.cores})
    target_spec = target_to_json(target)
    device = device_id(device_descriptor(target))
    weights = "shipped" if args.weights == "shipped" else os.path.abspath(args.weights)
    cdmpp = CDMPPModel(weights=weights, online=False)
    trained_on = cdmpp.predictor.trained_on
    split = trained_on.get("split", "")
    held_out = set(split[len("workload:"):].split(",")) if split.startswith("workload:") else set()
    from tunecore.dataset.evaluate import seconds_per_flop
    from tunecore.dataset.table import Dataset

    dataset = Dataset.load(args.dataset)
    networks = {f"zoo:{n}" for n in args.networks.split(",")}
    unseen = held_out | networks
    per_flop = seconds_per_flop(dataset, [r for r in dataset.rows
                                          if not unseen & set(dataset.tasks[r.task_key].workloads)], device)
    if per_flop is None:
        raise SystemExit(f"the dataset has no programs of device {device}: collect on this CPU first")
    work = os.path.join(args.out, "predict-work")
    os.makedirs(work, exist_ok=True)
    done = os.path.join(work, "runs.json")
    report = {"command": command_line("predict.py"), "environment": environment(target), "trials": args.trials,
              "passes": args.passes, "weights": {"file": args.weights, "split": trained_on.get("split"),
                                                 "devices": sorted(trained_on.get("devices", {}))},
              "device_seen": device in trained_on.get("devices", {}), "seconds_per_flop": per_flop,
              "dataset_fast_end": fast_end(dataset, device, networks, cdmpp),
              # the same on the networks it trained on: a fast end missed there too is in the data, not the networks
              "dataset_fast_end_trained": fast_end(dataset, device, dataset.workloads() - unseen, cdmpp),
              "networks": {}}
    for network in args.networks.split(","):
        model = f"zoo:{network}"
        store = os.path.join(work, f"{network}-ansor.db")
        tuning = cached_run(done, f"{network}/ansor", lambda: run_tunecore(
            model, args.trials, args.seed, search="ansor", cost_model="xgb", store=f"sqlite:{store}",
            extra_args=["--target", target_spec]))
        row = {"tuning_wall_s": tuning["wall_s"], "flops_constant_ms": flops_estimate_ms(model, target, per_flop)}
        for schedules, url in (("tuned", f"sqlite:{store}"), ("untuned", "memory:")):
            passes = [cached_run(done, f"{network}/{schedules}/{i}",
                                 lambda: predicted(model, target_spec, url, weights)) for i in range(args.passes)]
            tasks = passes[0]["tasks"]
            row[schedules] = {
                "tasks": len(tasks), "tasks_with_records": passes[0]["tasks_with_records"],
                "predicted_ms": passes[0]["predicted_ms"], "measured_ms": [p["measured_ms"] for p in passes],
                "stored_sum_ms": (sum(t["weight"] * t["stored_ms"] for t in tasks)
                                  if all(t["stored_ms"] is not None for t in tasks) else None),
                "device_note": passes[0].get("device_note")}
            ratios = [t["predicted_ms"] / t["stored_ms"] for t in tasks if t["stored_ms"]]
            if ratios:  # how far off cdmpp is on each task's tuned program, its own timing the truth
                row[schedules]["predicted_over_stored"] = {"geomean": float(np.exp(np.mean(np.log(ratios)))),
                                                           "min": min(ratios), "max": max(ratios)}
        report["networks"][network] = row
    write_results(args.out, "predict", report, markdown(report))


def _errors(estimate: float | None, measured: list[float]) -> str:
    if estimate is None:
        return "-"
    low, high = (f"{100 * e:.0f}" for e in sorted(abs(estimate - m) / m for m in (min(measured), max(measured))))
    return f"{low}%" if low == high else f"{low}-{high}%"


def markdown(report: dict) -> str:
    from tunecore.cli.render import cell

    seen = "a device the weights were trained on" if report["device_seen"] else "a device the weights never saw"
    lines = ["# `tunecore predict --measure` on networks cdmpp never saw", "",
             environment_line(report), "",
             f"cdmpp weights `{report['weights']['file']}`, held out `{report['weights']['split']}`; this target is "
             f"{seen}. Tuned: ansor+xgb, {report['trials']} trials per network, then each task's best program. "
             f"Untuned: every task as TVM compiles it without records. Measured: `--measure`, {report['passes']} "
             "passes (min-max). Error = |estimate - measured| / measured, over the passes. Tasks' own timings: "
             "the sum of weight x each task's best latency as tuning measured it (a perfect per-task predictor). "
             f"FLOPs constant: weight x FLOPs x {report['seconds_per_flop']:.3g} s/FLOP (this device's median in "
             "the dataset, held-out networks left out).", "",
             "| network | schedules | tasks | measured (ms) | cdmpp (ms) | cdmpp error | tasks' own timings (ms) | "
             "error | FLOPs constant (ms) | error |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for network, row in report["networks"].items():
        for schedules in ("tuned", "untuned"):
            r = row[schedules]
            measured = r["measured_ms"]
            lines.append(f"| {network} | {schedules} | {r['tasks']} | {min(measured):.4g}-{max(measured):.4g} | "
                         f"{cell(r['predicted_ms'])} | {_errors(r['predicted_ms'], measured)} | "
                         f"{cell(r['stored_sum_ms'])} | {_errors(r['stored_sum_ms'], measured)} | "
                         f"{cell(row['flops_constant_ms'])} | {_errors(row['flops_constant_ms'], measured)} |")
    ratios = [f"{network} {r['geomean']:.2f} ({r['min']:.2f}-{r['max']:.2f})"
              for network, row in report["networks"].items() if (r := row["tuned"].get("predicted_over_stored"))]
    if ratios:
        lines += ["", "cdmpp's prediction over the task's own timing, per tuned task (geometric mean, min-max): "
                  + "; ".join(ratios) + "."]
    for key, networks in (("dataset_fast_end", "the same networks'"), ("dataset_fast_end_trained",
                                                                       "the networks it trained on, their")):
        if fast := report.get(key):
            lines += ["", f"On {networks} {fast['programs']} programs of this device in the dataset "
                      f"({fast['tasks']} tasks), cdmpp's prediction over the measurement (geometric mean): "
                      f"{fast['all']:.2f} over all of them, {fast['fastest']:.2f} over each task's fastest (median "
                      f"{fast['fastest_median']:.2f})."]
    notes = {r[s]["device_note"] for r in report["networks"].values() for s in ("tuned", "untuned")} - {None}
    lines += [""] + [f"cdmpp said: {note}" for note in sorted(notes)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
