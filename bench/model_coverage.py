"""Model coverage: every model of the corpus (tunecore/workloads/corpus.py) through the commands a user runs.

Per model, each step a `tunecore` process of its own, as a user would type it:

  export    the ONNX file, written by torch.onnx.export (TorchScript exporter, dynamic batch axis); a model
            whose export fails is given as a PyTorch factory instead (`--model corpus.py:gpt2`)
  tasks     `tunecore tasks --json`: import and task extraction time, tasks, GFLOPs
  run       `tunecore run --trials N --search ansor --cost-model xgb`
  compile   `tunecore compile --json`: tuned and untuned latency, outputs checked against the untuned build
            and against onnxruntime (ONNX files) or the torch module (factories)

then onnxruntime's latency on the same file (torch eager's for a factory), timed in this process with the same
thread count. A step that fails is recorded with its one-line error, and the model's later steps are skipped.

    python bench/model_coverage.py [--models bert,gpt2,...] [--trials 32] [--work /tmp/tunecore-coverage]

Writes bench/results/model_coverage.{json,md}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from tunecore import experiments
from tunecore.experiments import command_line, environment, write_results


def main() -> None:
    from tunecore.workloads import corpus

    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--models", default=",".join(m.name for m in corpus.CORPUS))
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--work", default="/tmp/tunecore-coverage", help="ONNX files and stores")
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    results = {}
    for name in args.models.split(","):
        print(f"{name} ...", file=sys.stderr, flush=True)
        results[name] = cover(name, args.trials, args.work)
        print(f"  {json.dumps(results[name])[:400]}", file=sys.stderr, flush=True)
    report = {"benchmark": "model_coverage", "trials": args.trials, "environment": environment(),
              "results": results, "command": command_line("model_coverage.py")}
    write_results(args.out, "model_coverage", report, markdown(report))


def cover(name: str, trials: int, work: str) -> dict:
    from tunecore.workloads import corpus

    model = corpus.BY_NAME[name]
    row: dict = {"form": model.form, "why_torch": model.why_torch or None}
    started = time.perf_counter()
    try:
        spec, shapes = corpus.model_spec(name, work)
    except Exception as error:
        return {**row, "failed": "export", "error": error_text(error)}
    row["export_s"] = round(time.perf_counter() - started, 2)
    row["model"] = spec
    row["input_shapes"] = shapes
    model_args = ["--model", spec, *[a for s in shapes for a in ("--input-shape", s)]]
    store = os.path.join(work, f"{name}.db")
    experiments.remove_sqlite(store)
    steps = [
        ("tasks", ["tasks", *model_args, "--json"]),
        ("run", ["run", *model_args, "--trials", str(trials), "--search", "ansor", "--cost-model", "xgb",
                 "--store", store, "--json"]),
        ("compile", ["compile", *model_args, "--store", store, "--json"]),
    ]
    for step, command in steps:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "tunecore.cli", *command], capture_output=True, text=True)
        seconds = round(time.perf_counter() - started, 2)
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            return {**row, "failed": step, "error": (lines[-1] if lines else f"exit {done.returncode}")[:400]}
        out = json.loads(done.stdout)
        if step == "tasks":
            row.update(tasks_s=seconds, tasks=len(out["tasks"]),
                       gflop=sum(t["flops"] * t["weight"] for t in out["tasks"]) / 1e9)
        elif step == "run":
            row.update(run_s=seconds, trials_measured=out["trials_measured"], errors=out["errors"])
        else:
            row.update(compile_s=seconds, **{k: out[k] for k in (
                "latency_ms", "untuned_latency_ms", "outputs_match", "max_relative_error", "reference",
                "reference_relative_error", "tasks_tuned", "tasks_total", "threads")})
    row["framework"], row["framework_latency_ms"] = framework_latency(name, spec, row["threads"])
    return row


def framework_latency(name: str, spec: str, threads: int) -> tuple[str, float]:
    """Median ms of onnxruntime on the ONNX file, or of the torch module for a factory, at ``threads``."""
    from tunecore.workloads import corpus

    module, inputs = corpus.factory(name)
    if spec.endswith(".onnx"):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        session = onnxruntime.InferenceSession(spec, options, providers=["CPUExecutionProvider"])
        feed = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)}
        return "onnxruntime", experiments.median_call_seconds(lambda: session.run(None, feed)) * 1e3
    import torch

    torch.set_num_threads(threads)
    with torch.no_grad():
        return "torch eager", experiments.median_call_seconds(lambda: module(*inputs)) * 1e3


def error_text(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[-1] if lines else ''}"[:400]


def markdown(report: dict) -> str:
    lines = [
        f"# Model coverage: the corpus through `tunecore tasks`, `run --trials {report['trials']}` "
        f"(ansor + xgb) and `compile`",
        "",
        experiments.environment_line(report),
        "",
        "| model | form | import + tasks s | tasks (tuned) | GFLOP | untuned ms | tuned ms | framework ms | "
        "tuned vs framework | outputs vs untuned / framework |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    failures = []
    for name, r in report["results"].items():
        if "failed" in r:
            lines.append(f"| {name} | {r['form']} | failed at {r['failed']} | | | | | | | |")
            failures.append(f"- **{name}** ({r['failed']}): {r['error']}")
            continue
        framework = f"{r['framework_latency_ms']:.2f} ({r['framework']})"
        match = "match" if r["outputs_match"] else "DIFFER"
        lines.append(
            f"| {name} | {r['form']} | {r['tasks_s']:.1f} | {r['tasks']} ({r['tasks_tuned']}) | {r['gflop']:.2f} | "
            f"{r['untuned_latency_ms']:.2f} | {r['latency_ms']:.2f} | {framework} | "
            f"{r['latency_ms'] / r['framework_latency_ms']:.2f} | {match} ({r['max_relative_error']:.1g} / "
            f"{r['reference_relative_error']:.1g}) |")
    torch_forms = [f"- **{n}**: {r['why_torch']}" for n, r in report["results"].items() if r.get("why_torch")]
    if torch_forms:
        lines += ["", "Given as a PyTorch factory (`--model file.py:factory`) because the ONNX export fails:", "",
                  *torch_forms]
    if failures:
        lines += ["", "Failures:", "", *failures]
    lines += ["", "import + tasks: `tunecore tasks` as a process (ONNX folding, TVM's frontend, fusion, task "
              "extraction; includes starting Python and TVM). Transformers are built at their real widths with 2 "
              "layers (BERT, DistilBERT, GPT-2, T5, ViT) or depths [1, 1, 2, 1] (Swin, ConvNeXt)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
