"""What the shipped weights of cdmpp and tlm know about networks they never saw, against untrained models and
the simplest baselines.

    python bench/shipped_weights.py [--dataset datasets/cpu-programs.parquet]

Both weights files record what they were trained on and which networks were held out (cdmpp: ``split``, tlm:
``exclude``); everything here is measured on the held-out side of the shipped dataset, on every device.

- **cdmpp**: ranking within a task (Spearman, pairwise accuracy, top-1/top-5 score of ``tunecore costmodel
  eval``) and latency (MAPE) of the shipped weights, of an untrained network with the shipped normalizer (what
  a swapped-in untrained file would give), of a FLOPs constant (the training side's median seconds per FLOP of
  the device, times the task's FLOPs: one guess per task, from the training side) and of the per-task
  constant floor (``tunecore.dataset.evaluate.constant_floor``: for each held-out group the constant with the
  lowest MAPE, chosen knowing its labels; it ranks nothing, and no per-task constant predicts better).
- **tlm**: on the fastest measured program of every held-out (task, device), the teacher-forced loss per
  decision token over the whole vocabulary (``model.mean_loss``) and over the tokens the decoder allows at that
  step (``model.choice_loss``), beside choosing uniformly among those tokens, for tlm-cpu.pt, tlm-base.pt and
  an untrained model of the same size.

Writes bench/results/shipped_weights.{json,md}. The plugins' tests assert the same comparisons on a slice.
"""

from __future__ import annotations

import collections
import time

import numpy as np

from tunecore import experiments
from tunecore.experiments import command_line, environment, write_results

CDMPP_COLUMNS = ("spearman", "pairwise_accuracy", "top1_score", "top5_score", "mape")


def cdmpp_rows(dataset, seed: int) -> dict:
    from tunecore_cdmpp_predictor.costmodel import CDMPPModel
    from tunecore_cdmpp_predictor.model import Predictor

    from tunecore.dataset.evaluate import constant_floor, guess_metrics, held_out_metrics, measured_groups
    from tunecore.dataset.split import split
    from tunecore.targets import device_id

    shipped = CDMPPModel(weights="shipped", online=False)
    trained_on = shipped.predictor.trained_on
    parts = split(dataset, trained_on["split"], seed)
    test = measured_groups(dataset, [r for r in parts.test if r.latency is not None])
    weights = [parts.weights.get(task.workload_hash, 1) for task, *_ in test]
    untrained = CDMPPModel(weights="none", online=False)
    untrained.predictor = Predictor(shipped.predictor.arch, seed=seed + 1)
    untrained.predictor.normalizer = shipped.predictor.normalizer
    rows = {}
    for name, model in (("shipped weights", shipped), ("untrained network", untrained)):
        started = time.perf_counter()
        rows[name] = {**held_out_metrics(model, test, weights, seed),
                      "seconds": round(time.perf_counter() - started, 1)}
    latencies = [np.array([r.latency for r in results]) for _, _, results, _ in test]
    per_flop = collections.defaultdict(list)
    for row in parts.train:
        if row.latency is not None and dataset.tasks[row.task_key].flops:
            per_flop[row.device_id].append(row.latency / dataset.tasks[row.task_key].flops)
    flops_guess = [np.full(len(lat), np.median(per_flop[device_id(device)]) * task.flops)
                   for lat, (task, *_, device) in zip(latencies, test)]
    rows["FLOPs constant"] = guess_metrics(latencies, flops_guess, weights, seed)
    rows["per-task constant (floor)"] = constant_floor(test, parts, seed)
    return {"split": trained_on["split"], "trained_on": {k: trained_on[k] for k in ("programs", "devices", "epochs")},
            "test": {"groups": len(test), "programs": int(sum(map(len, latencies)))}, "rows": rows}


def tlm_rows(dataset) -> dict:
    from tunecore_tlm_generator import model as lm
    from tunecore_tlm_generator.search import SHIPPED, SHIPPED_BASE
    from tunecore_tlm_generator.training import Sketches, best_programs, task_targets

    _, vocab, metadata = lm.load(SHIPPED)
    excluded = {w for w in metadata["trained_on"]["exclude"].split(",") if w}
    pairs = [(task, target) for task, target in task_targets(dataset) if excluded & set(task.workloads)]
    programs = [(p, d) for p, d, _ in best_programs(dataset, Sketches(), pairs, top=1)]
    examples = [e for p, d in programs if (e := lm.encode_example(p, d, vocab))]
    sizes = {k: metadata["config"][k] for k in ("n_layer", "n_head", "n_embd", "context")}
    rows = {}
    models = {"tlm-cpu.pt (shipped)": lm.load(SHIPPED)[0], "tlm-base.pt (shipped)": lm.load(SHIPPED_BASE)[0],
              "untrained": lm.new_model(vocab, 0, **sizes)}
    for name, model in models.items():
        choice = lm.choice_loss(model, vocab, programs)
        rows[name] = {"loss": round(lm.mean_loss(model, examples), 4), "choice_loss": round(choice["loss"], 4),
                      "uniform_choice_loss": round(choice["uniform_loss"], 4), "programs": choice["programs"]}
    return {"exclude": sorted(excluded), "pairs": len(pairs), "rows": rows}


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--dataset", default="datasets/cpu-programs.parquet")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from tunecore.dataset.table import Dataset

    dataset = Dataset.load(args.dataset)
    report = {"command": command_line("shipped_weights.py"), "environment": environment(), "dataset": args.dataset,
              "cdmpp": cdmpp_rows(dataset, args.seed), "tlm": tlm_rows(dataset)}
    write_results(args.out, "shipped_weights", report, markdown(report))


def markdown(report: dict) -> str:
    from tunecore.cli.render import cell

    cdmpp, tlm = report["cdmpp"], report["tlm"]
    lines = ["# The shipped weights on networks they never saw", "",
             f"{experiments.environment_line(report)} Dataset `{report['dataset']}`.", "",
             f"## cdmpp-cpu.pt: held out `{cdmpp['split']}`", "",
             f"Trained on {cdmpp['trained_on']['programs']} programs ({cdmpp['trained_on']['epochs']} epochs); tested "
             f"on {cdmpp['test']['programs']} programs in {cdmpp['test']['groups']} task x device groups. Ranking "
             "within each group; MAPE over all programs.", "",
             "| predictor | " + " | ".join(CDMPP_COLUMNS) + " |", "|---|" + "---:|" * len(CDMPP_COLUMNS)]
    for name, row in cdmpp["rows"].items():
        lines.append(f"| {name} | " + " | ".join(cell(row.get(c)) for c in CDMPP_COLUMNS) + " |")
    lines += ["", f"## tlm: held out {', '.join(tlm['exclude'])}", "",
              f"The fastest measured program of each of {tlm['pairs']} held-out (task, target) pairs; loss per "
              "decision token (nats), lower is better. `loss`: over the whole vocabulary (teacher-forced); `choice "
              "loss`: over the tokens the decoder allows at each step, as it samples; `uniform`: choosing uniformly "
              "among those tokens.", "",
              "| model | programs | loss | choice loss | uniform |", "|---|---:|---:|---:|---:|"]
    for name, row in tlm["rows"].items():
        lines.append(f"| {name} | {row['programs']} | {row['loss']:.3f} | {row['choice_loss']:.3f} "
                     f"| {row['uniform_choice_loss']:.3f} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
