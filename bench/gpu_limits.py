"""How well a GPU sketch's limits, as tlm's decoder reads them (``gpu_limits.py``: threads per block, shared memory),
tell the programs MetaSchedule's GPU postprocessors accept: uniform samples of every task of the networks, each
judged by both.

    python bench/gpu_limits.py [--models zoo:bert-base,zoo:resnet-18,zoo:resnet-50,zoo:mobilenet-v2] [--draws 60]
                               [--dataset datasets/gpu-h100.parquet] [--name gpu_limits]

The target is the GPU dataset's (its rows' target: the H100's). Per task, --draws uniform samples of its sketches in
turn (seeds 1..draws), TVM's own sampler: whether the limits let the decisions through, and whether the
postprocessors accept the program. The limits are sound when no accepted program is ruled out (decoding then loses
nothing), and tight when what they let through is accepted. Writes bench/results/<name>.json and .md.
"""

from __future__ import annotations

from tunecore import experiments
from tunecore.experiments import command_line, environment, environment_line, write_results

NETWORKS = "zoo:bert-base,zoo:resnet-18,zoo:resnet-50,zoo:mobilenet-v2"
OUTCOMES = ("ruled out, rejected", "ruled out, accepted", "let through, accepted", "let through, rejected")


def judge(task, draws: int) -> dict:
    """Counts of OUTCOMES over the task's uniform samples, and its sketches with limits."""
    from tunecore_tlm_generator.sentences import Unexpressible
    from tunecore_tlm_generator.sketches import apply_decisions, probe, sampled_decisions

    from tunecore.space import DesignSpace

    space = DesignSpace(task, seed=0)
    postprocs = space.thread_postprocs()
    prompts = []
    for i in range(len(space.sketches)):
        try:
            prompts.append(probe(space, i))
        except Unexpressible:
            continue
    counts = dict.fromkeys(OUTCOMES, 0)
    for seed in range(1, draws + 1) if prompts else ():
        prompt = prompts[seed % len(prompts)]
        decisions = sampled_decisions(space, prompt, seed)
        if decisions is None:
            continue
        written = [slot.from_decision(d) for slot, d in zip(prompt.slots, decisions)]
        passed = prompt.limits is None or prompt.limits.satisfied(written, False)
        accepted = apply_decisions(space, prompt, decisions, seed=1, postprocs=postprocs)[0] is not None
        counts[f"{'let through' if passed else 'ruled out'}, {'accepted' if accepted else 'rejected'}"] += 1
    return {"sketches": len(prompts), "with_limits": sum(p.limits is not None for p in prompts), **counts}


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--models", default=NETWORKS)
    parser.add_argument("--draws", type=int, default=60)
    parser.add_argument("--dataset", default="datasets/gpu-h100.parquet", help="the GPU dataset (its target)")
    parser.add_argument("--name", default="gpu_limits")
    args = parser.parse_args()
    if args.draws < 1:
        parser.error(f"--draws {args.draws}: expected an integer >= 1")

    from tunecore.errors import UsageError
    from tunecore.targets import resolve_target
    from tunecore.workloads import extract_tasks, load_workload

    try:
        target_json = experiments.dataset_target(args.dataset)
    except UsageError as error:
        parser.error(str(error))
    target = resolve_target(target_json)
    report = {"command": command_line("gpu_limits.py"), "environment": environment(), "target": target_json,
              "draws": args.draws, "tasks": []}
    for model in args.models.split(","):
        for task in extract_tasks(load_workload(model), target):
            report["tasks"].append({"workload": model, "name": task.name, **judge(task, args.draws)})
            print(model, report["tasks"][-1], flush=True)
    write_results(args.out, args.name, report, markdown(report))


def markdown(report: dict) -> str:
    lines = ["# A GPU sketch's limits against MetaSchedule's GPU postprocessors", "",
             environment_line(report), f"Target: `{report['target']}`.", "",
             f"Per task, {report['draws']} uniform samples of its sketches (TVM's sampler): whether the limits tlm's "
             "decoder reads from the sketch (threads per block, shared memory; `gpu_limits.py`) let the decisions "
             "through, and whether the postprocessors (VerifyGPUCode among them) accept the program. Sound: no "
             "accepted program ruled out. Tight: what they let through is accepted.", "",
             "| workload | tasks (with limits) | " + " | ".join(OUTCOMES) + " |",
             "|---|---:|" + "---:|" * len(OUTCOMES)]
    for workload in dict.fromkeys(t["workload"] for t in report["tasks"]):
        rows = [t for t in report["tasks"] if t["workload"] == workload]
        lines.append(f"| {workload} | {len(rows)} ({sum(t['with_limits'] > 0 for t in rows)}) | "
                     + " | ".join(str(sum(t[o] for t in rows)) for o in OUTCOMES) + " |")
    rows = report["tasks"]
    lines.append(f"| all | {len(rows)} ({sum(t['with_limits'] > 0 for t in rows)}) | "
                 + " | ".join(f"**{sum(t[o] for t in rows)}**" for o in OUTCOMES) + " |")
    missed = [t for t in rows if t["let through, rejected"] or t["ruled out, accepted"]]
    lines += ["", "## Tasks where the limits and the postprocessors disagree", ""]
    lines += [f"- {t['name']} ({t['workload']}): " + ", ".join(f"{o} {t[o]}" for o in OUTCOMES) for t in missed] or [
        "None."]
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
