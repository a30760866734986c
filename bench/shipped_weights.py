"""What the shipped weights of cdmpp and tlm know about networks they never saw, against untrained models and
the simplest baselines.

    python bench/shipped_weights.py [--dataset datasets/cpu-programs-v2.parquet] [--only cdmpp|tlm]
                                    [--tlm-weights LABEL=FILE ...] [--name shipped_weights]

Both weights files record what they were trained on and which networks were held out (cdmpp: ``split``, tlm:
``exclude``); everything here is measured on the held-out side of the shipped dataset, on every device (cdmpp:
  one table per device, one it was trained on or a CPU it never saw).

- **cdmpp**: ranking within a task (Spearman, pairwise accuracy, top-1/top-5 score of ``tunecore costmodel
  eval``) and latency (MAPE) of the shipped weights, of an untrained network with the shipped normalizer (what
  a swapped-in untrained file would give), of a FLOPs constant (the training side's median seconds per FLOP of
  the device, times the task's FLOPs: one guess per task, from the training side) and of the per-task
  constant floor (``tunecore.dataset.evaluate.constant_floor``: for each held-out group the constant with the
  lowest MAPE, chosen knowing its labels; it ranks nothing, and no per-task constant predicts better).
- **tlm**: on the fastest measured program of every held-out (task, device), the teacher-forced loss per
  decision token over the whole vocabulary (``model.mean_loss``) and over the tokens the decoder allows at that
  step (``model.choice_loss``), beside choosing uniformly among those tokens, for tlm-cpu.pt, tlm-base.pt and
  an untrained model of the same size (and any ``--tlm-weights`` held out alike), also per kind of decision
  (a reduction's split, a spatial loop's, a categorical, a compute location) and at other sampling
  temperatures (a model sure of the wrong tokens scores better when sampled hotter); and on every measured program of
  the held-out networks on the primary device, by (task, sketch): whether the decoder gives the faster programs
  more probability (Spearman), and how fast the program it finds most likely is, beside a random pick
  (``speed_agreement``).

Writes bench/results/<name>.{json,md}. The plugins' tests assert the same comparisons on a slice.
"""

from __future__ import annotations

import collections
import os
import time

import numpy as np

from tunecore import experiments
from tunecore.experiments import command_line, environment, write_results
from tunecore.interfaces import UsageError

CDMPP_COLUMNS = ("spearman", "pairwise_accuracy", "top1_score", "top5_score", "mape")
TEMPERATURES = (0.7, 1.0, 1.3, 1.6, 2.0)  # `-O search.temperature`: 1 is the default, the table's own choice loss


def cdmpp_rows(dataset, seed: int) -> dict:
    """The held-out side's metrics per device: one the weights were trained on, or one they never saw."""
    from tunecore_cdmpp_predictor.costmodel import CDMPPModel
    from tunecore_cdmpp_predictor.model import Predictor

    from tunecore.dataset.evaluate import (
        constant_floor,
        guess_metrics,
        held_out_metrics,
        measured_groups,
        seconds_per_flop,
    )
    from tunecore.dataset.split import split
    from tunecore.dataset.table import describe_device

    shipped = CDMPPModel(weights="shipped", online=False)
    trained_on = shipped.predictor.trained_on
    parts = split(dataset, trained_on["split"], seed)
    untrained = CDMPPModel(weights="none", online=False)
    untrained.predictor = Predictor(shipped.predictor.arch, seed=seed + 1)
    untrained.predictor.normalizer = shipped.predictor.normalizer
    devices = {}
    for device in sorted({r.device_id for r in parts.test if r.latency is not None}):
        test = measured_groups(dataset, [r for r in parts.test if r.latency is not None and r.device_id == device])
        weights = [parts.weights.get(task.workload_hash, 1) for task, *_ in test]
        rows = {}
        for name, model in (("shipped weights", shipped), ("untrained network", untrained)):
            started = time.perf_counter()
            rows[name] = {**held_out_metrics(model, test, weights, seed),
                          "seconds": round(time.perf_counter() - started, 1)}
        latencies = [np.array([r.latency for r in results]) for _, _, results, _ in test]
        per_flop = seconds_per_flop(dataset, parts.train, device)
        if per_flop is not None:  # a device whose every program is held out has no training side to take it from
            flops_guess = [np.full(len(lat), per_flop * task.flops) for lat, (task, *_) in zip(latencies, test)]
            rows["FLOPs constant"] = guess_metrics(latencies, flops_guess, weights, seed)
        rows["per-task constant (floor)"] = constant_floor(test, parts, seed)
        devices[device] = {"device": describe_device(dataset.devices[device]), "seen": device in trained_on["devices"],
                           "groups": len(test), "programs": int(sum(map(len, latencies))), "rows": rows}
    return {"split": trained_on["split"],
            "trained_on": {k: trained_on.get(k) for k in ("programs", "devices", "epochs", "max_spread")},
            "devices": devices}


def tlm_rows(dataset, more: dict[str, str]) -> dict:
    """``more``: {label: weights file} of other models held out alike, scored beside the shipped ones."""
    from tunecore_tlm_generator import model as lm
    from tunecore_tlm_generator.search import SHIPPED, SHIPPED_BASE
    from tunecore_tlm_generator.training import Sketches, best_programs, task_targets

    shipped, vocab, metadata = lm.load(SHIPPED)
    excluded = set(lm.held_out_workloads(metadata))
    loaded = {label: lm.load(path) for label, path in more.items()}
    for label, path in more.items():
        if set(lm.held_out_workloads(loaded[label][2])) != excluded:
            raise UsageError(f"--tlm-weights {label}={path}: trained without other workloads than the shipped "
                             f"weights ({', '.join(sorted(excluded))})")
    pairs = [(task, target) for task, target in task_targets(dataset) if excluded & set(task.workloads)]
    sketches = Sketches()
    programs = [(p, d) for p, d, _ in best_programs(dataset, sketches, pairs, top=1)]
    # every measured program of the primary device, by sketch: does the model give the faster ones more probability?
    primary = collections.Counter(r.device_id for r in dataset.rows).most_common(1)[0][0]
    by_sketch = collections.defaultdict(list)
    for prompt, decisions, ratio in best_programs(dataset, sketches, pairs, top=1 << 30, device_ids={primary}):
        by_sketch[str(prompt.words)].append((prompt, decisions, ratio))
    groups = [members for members in by_sketch.values() if len(members) >= SKETCH_GROUP]
    sizes = {k: metadata["config"][k] for k in ("n_layer", "n_head", "n_embd", "context")}
    rows = {}
    models = {"tlm-cpu.pt (shipped)": (shipped, vocab), "tlm-base.pt (shipped)": lm.load(SHIPPED_BASE)[:2],
              "untrained": (lm.new_model(vocab, 0, **sizes), vocab),
              **{f"{label} ({vocab_of.tile_order})": (model, vocab_of)
                 for label, (model, vocab_of, _) in loaded.items()}}
    for name, (model, vocab_of) in models.items():
        examples = [e for p, d in programs if (e := lm.encode_example(p, d, vocab_of))]
        at = {t: lm.choice_loss(model, vocab_of, programs, t) for t in TEMPERATURES}
        choice = at[1.0]
        rows[name] = {"loss": round(lm.mean_loss(model, examples), 4), "choice_loss": round(choice["loss"], 4),
                      "uniform_choice_loss": round(choice["uniform_loss"], 4), "programs": choice["programs"],
                      "per_decision": decision_losses(model, vocab_of, programs),
                      "choice_loss_at": {str(t): round(c["loss"], 4) for t, c in at.items()},
                      **speed_agreement(model, vocab_of, groups)}
    return {"exclude": sorted(excluded), "pairs": len(pairs), "rows": rows, "primary_device": primary,
            "sketch_groups": len(groups), "random_pick": round(float(np.exp(np.mean(
                [np.mean(np.log([r for *_, r in members])) for members in groups]))), 3)}


SKETCH_GROUP = 16  # measured programs a (task, sketch) needs to be ranked


def decision_kind(slot) -> str:
    if slot.kind == "SamplePerfectTile":
        return f"tile of {slot.n}"
    return {"SampleCategorical": "categorical", "SampleComputeLocation": "compute location"}[slot.kind]


def decision_losses(model, vocab, programs: list) -> dict:
    """Per kind of decision, the choice loss per decision (nats: its tokens' together, as the decoder samples them)
    beside choosing uniformly among the legal tokens at each step: where on networks it never saw the model is
    worse than knowing only what is legal."""
    from tunecore_tlm_generator import model as lm

    totals = collections.defaultdict(lambda: [0.0, 0.0, set()])  # kind: [model nats, uniform nats, decisions]
    for n, (prompt, decisions) in enumerate(programs):
        for slot, chosen, uniform in lm.choice_steps(model, vocab, prompt, decisions) or []:
            row = totals[decision_kind(prompt.slots[slot])]
            row[0] -= chosen
            row[1] -= uniform
            row[2].add((n, slot))
    return {kind: {"decisions": len(seen), "loss": round(nats / len(seen), 4), "uniform": round(uniform / len(seen), 4)}
            for kind, (nats, uniform, seen) in sorted(totals.items())}


def speed_agreement(model, vocab, groups: list) -> dict:
    """Over (task, sketch) groups of measured programs: the mean Spearman correlation of the log-probability the
    decoder gives a program with its speed, and the latency (over the group's best) of the program it finds most
    likely (geometric mean); the same for choosing uniformly among the legal tokens."""
    from scipy import stats
    from tunecore_tlm_generator import model as lm

    rho, top, uniform_rho, uniform_top = [], [], [], []
    for members in groups:
        scored = [(s, ratio) for prompt, decisions, ratio in members
                  if (s := lm.choice_log_probs(model, vocab, prompt, decisions))]
        if len(scored) < SKETCH_GROUP:
            continue
        ratios = np.array([ratio for _, ratio in scored])
        for log_p, rhos, tops in (([s[0] for s, _ in scored], rho, top),
                                  ([s[1] for s, _ in scored], uniform_rho, uniform_top)):
            rhos.append(stats.spearmanr(log_p, -ratios)[0] if np.ptp(log_p) > 0 else 0.0)
            tops.append(ratios[int(np.argmax(log_p))])
    return {"groups": len(rho), "spearman_speed": round(float(np.nanmean(rho)), 3),
            "most_likely_latency": round(float(np.exp(np.mean(np.log(top)))), 3),
            "uniform_spearman_speed": round(float(np.nanmean(uniform_rho)), 3),
            "uniform_most_likely_latency": round(float(np.exp(np.mean(np.log(uniform_top)))), 3)}


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--dataset", default="datasets/cpu-programs-v2.parquet")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tlm-weights", action="append", default=[], metavar="LABEL=FILE",
                        help="another tlm weights file held out alike, scored beside the shipped ones (repeatable)")
    parser.add_argument("--only", choices=("cdmpp", "tlm"), help="one of the two parts")
    parser.add_argument("--name", default="shipped_weights")
    args = parser.parse_args()
    more = dict(w.partition("=")[::2] for w in args.tlm_weights)
    for label, path in more.items():
        if not label or not os.path.isfile(path):
            parser.error(f"--tlm-weights {label}={path}: expected LABEL=FILE of an existing weights file")
    from tunecore.dataset.table import Dataset

    dataset = Dataset.load(args.dataset)
    try:
        tlm = tlm_rows(dataset, more) if args.only != "cdmpp" else None
    except UsageError as error:
        parser.exit(2, f"{error}\n")
    report = {"command": command_line("shipped_weights.py"), "environment": environment(), "dataset": args.dataset,
              "cdmpp": cdmpp_rows(dataset, args.seed) if args.only != "tlm" else None, "tlm": tlm}
    write_results(args.out, args.name, report, markdown(report))


def markdown(report: dict) -> str:
    lines = ["# The shipped weights on networks they never saw", "",
             f"{experiments.environment_line(report)} Dataset `{report['dataset']}`."]
    if report["cdmpp"]:
        lines += cdmpp_markdown(report["cdmpp"])
    if report["tlm"]:
        lines += tlm_markdown(report["tlm"])
    return "\n".join(lines + [""])


def cdmpp_markdown(cdmpp: dict) -> list[str]:
    from tunecore.cli.render import cell

    lines = ["", f"## cdmpp-cpu.pt: held out `{cdmpp['split']}`", "",
             f"Trained on {cdmpp['trained_on']['programs']} programs of the devices "
             f"{', '.join(cdmpp['trained_on']['devices'])} ({cdmpp['trained_on']['epochs']} epochs, timings within "
             f"{cdmpp['trained_on']['max_spread'] or 'any spread'}); tested on the held-out networks' programs of "
             "every device, one table per device. Ranking within each task; MAPE over all programs. The FLOPs "
             "constant is the training side's median seconds per FLOP of the device times the task's FLOPs."]
    for device, part in cdmpp["devices"].items():
        seen = "a device it was trained on" if part["seen"] else "a CPU it never saw"
        lines += ["", f"### {part['device']} (`{device}`, {seen}): {part['programs']} programs, {part['groups']} "
                  "tasks", "", "| predictor | " + " | ".join(CDMPP_COLUMNS) + " |",
                  "|---|" + "---:|" * len(CDMPP_COLUMNS)]
        for name, row in part["rows"].items():
            lines.append(f"| {name} | " + " | ".join(cell(row.get(c)) for c in CDMPP_COLUMNS) + " |")
    return lines


def tlm_markdown(tlm: dict) -> list[str]:
    lines = ["", f"## tlm: held out {', '.join(tlm['exclude'])}", "",
             f"The fastest measured program of each of {tlm['pairs']} held-out (task, target) pairs; loss per "
             "decision token (nats), lower is better. `loss`: over the whole vocabulary (teacher-forced); `choice "
             "loss`: over the tokens the decoder allows at each step, as it samples; `uniform`: choosing uniformly "
             "among those tokens. In parentheses: the tile order the model writes factors in.", "",
             "| model | programs | loss | choice loss | uniform |", "|---|---:|---:|---:|---:|"]
    for name, row in tlm["rows"].items():
        lines.append(f"| {name} | {row['programs']} | {row['loss']:.3f} | {row['choice_loss']:.3f} "
                     f"| {row['uniform_choice_loss']:.3f} |")
    kinds = sorted({kind for row in tlm["rows"].values() for kind in row.get("per_decision", {})})
    if kinds:
        lines += ["", "The same programs, per kind of decision: choice loss per decision (nats, its tokens together), "
                  "in parentheses choosing uniformly among the legal tokens at each step (which depends on the order "
                  "the factors are written in). `tile of 2`: a reduction loop's split; `tile of 4`: a spatial "
                  "loop's.", "", "| model | " + " | ".join(kinds) + " |", "|---|" + "---:|" * len(kinds)]
        for name, row in tlm["rows"].items():
            cells = [(f"{d['loss']:.3f} ({d['uniform']:.3f})" if (d := row["per_decision"].get(kind)) else "-")
                     for kind in kinds]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if all("choice_loss_at" in row for row in tlm["rows"].values()):
        lines += ["", "The choice loss of the same programs with the model's logits divided by a sampling temperature "
                  "(`-O search.temperature=T`; 1 is the default): where it falls as T rises, the model is surer of "
                  "its tokens than the held-out best programs bear out.", "",
                  "| model | " + " | ".join(f"T = {t:g}" for t in TEMPERATURES) + " |",
                  "|---|" + "---:|" * len(TEMPERATURES)]
        for name, row in tlm["rows"].items():
            lines.append(f"| {name} | " + " | ".join(f"{row['choice_loss_at'][str(t)]:.3f}" for t in TEMPERATURES)
                         + " |")
    uniform = next(iter(tlm["rows"].values()))
    lines += ["", f"Every measured program of the held-out networks on `{tlm['primary_device']}`, in "
              f"{tlm['sketch_groups']} (task, sketch) groups of >= {SKETCH_GROUP}: does the decoder give the faster "
              "programs of a sketch more probability? Spearman correlation of a program's log-probability (as the "
              "decoder samples) with its speed, mean over groups, and the latency over the group's best of the "
              "program it finds most likely (geometric mean). A program picked at random: "
              f"{tlm['random_pick']:.2f}x the best.", "",
              "| model | groups | Spearman (log-probability, speed) | most likely program, latency / best |",
              "|---|---:|---:|---:|"]
    for name, row in tlm["rows"].items():
        lines.append(f"| {name} | {row['groups']} | {row['spearman_speed']:.3f} | {row['most_likely_latency']:.2f} |")
    lines.append(f"| choosing uniformly among legal tokens | {uniform['groups']} "
                 f"| {uniform['uniform_spearman_speed']:.3f} | {uniform['uniform_most_likely_latency']:.2f} |")
    return lines


if __name__ == "__main__":
    main()
