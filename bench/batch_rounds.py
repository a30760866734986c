"""A network tuned in rounds of batches, as on a device without TVM's compiler, against uniform batches of the
same sizes and against `tunecore run` at the same number of trials; each built from its store and timed together.

A round of an arm: `tunecore dataset export-batch --per-task N --seed R --store S [--search ansor --cost-model xgb]`
builds the round's programs (none measured before), `python -m tunecore.measure.batch DIR` times them (the device's
part), `tunecore dataset import-batch` and `tunecore dataset import` put them into the arm's dataset and store S.
The two batch arms share their first round (uniform samples); after it, one draws uniform samples again and the other
takes what ansor's search proposes with xgb learned from the store. `tunecore run` gets as many trials as the uniform
arm built in all. Then, in this process, the network is built untuned and from each store (what `tunecore compile`
builds), outputs are checked against the untuned build's, and all builds are timed in alternating passes.

With --split, every search arm also runs as one whose rounds take as many programs as the uniform arm's, given out
over the tasks as `tunecore run`'s scheduler would (`export-batch --trials N`) instead of --per-task each.

    python bench/batch_rounds.py [--model zoo:resnet-18] [--rounds 4] [--per-task 16] [--search-arm population=512]
                                 [--split]

Resumable: every step's output is kept in --work. Writes bench/results/batch_rounds.{json,md}.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

from tunecore import experiments
from tunecore.experiments import command_line, environment, write_results

RANDOM, SEARCH, ONLINE = "uniform batches", "ansor+xgb batches", "ansor+xgb run"
SPLIT = "split as run's scheduler"


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--model", default="zoo:resnet-18")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--per-task", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--search-arm", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                        help="one more arm of ansor+xgb batches with these search options, e.g. population=512")
    parser.add_argument("--split", action="store_true",
                        help="each search arm also with its rounds split over the tasks (export-batch --trials)")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "tunecore-bench-batch-rounds"))
    args = parser.parse_args()
    if args.rounds < 2 or args.per_task < 1:
        parser.error("--rounds: at least 2 (a first uniform round, then the search's); --per-task: at least 1")
    if not all("=" in kv for spec in args.search_arm for kv in spec.split(",")):
        parser.error("--search-arm: KEY=VALUE[,KEY=VALUE...], e.g. population=512")
    searches = {SEARCH: [], **{f"{SEARCH}, {spec}": [f"-Osearch.{kv}" for kv in spec.split(",")]
                               for spec in args.search_arm}}
    if args.split:
        searches.update({f"{arm}, {SPLIT}": options for arm, options in searches.items()})
    os.makedirs(args.work, exist_ok=True)
    stores = {arm: os.path.join(args.work, f"{slug(arm)}.db") for arm in (RANDOM, *searches, ONLINE)}
    rounds: dict[str, list[dict]] = {arm: [] for arm in (RANDOM, *searches)}
    for r in range(args.rounds):
        for arm in rounds:
            shared = r == 0 and arm != RANDOM  # the first round is the uniform arm's, imported into every arm
            directory = os.path.join(args.work, f"{slug(RANDOM if shared else arm)}-{r}")
            search = ["--search", "ansor", "--cost-model", "xgb", *searches[arm]] if arm != RANDOM and r > 0 else []
            first = rounds[RANDOM][0] if shared else None
            size = (["--trials", str(rounds[RANDOM][r]["programs"])] if arm.endswith(SPLIT)
                    else ["--per-task", str(args.per_task)])
            rounds[arm].append(batch_round(args, directory, stores[arm], r, [*size, *search], first))
            print(f"  {arm} round {r}: {rounds[arm][-1]}", file=sys.stderr, flush=True)
    trials = sum(r["programs"] for r in rounds[RANDOM])
    online = experiments.cached_run(
        os.path.join(args.work, "runs.json"), f"{args.model} {trials} {args.seed}",
        lambda: experiments.run_tunecore(args.model, trials, args.seed, search="ansor", cost_model="xgb",
                                         store=f"sqlite:{stores[ONLINE]}"))
    print("building and timing ...", file=sys.stderr, flush=True)
    timed = experiments.time_builds_together(args.model, stores, args.passes)
    report = {"benchmark": "batch_rounds", "model": args.model, "rounds": args.rounds, "per_task": args.per_task,
              "seed": args.seed, "passes": args.passes, "batch_rounds": rounds, "run": online, "builds": timed,
              "environment": environment(), "command": command_line("batch_rounds.py")}
    write_results(args.out, "batch_rounds", report, markdown(report))


def slug(arm: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in arm)


def batch_round(args, directory: str, store: str, r: int, export: list[str], shared: dict | None) -> dict:
    """One round of an arm (resumed where it stopped): its batch built (``export``: its size and search options),
    timed and imported; what it cost and the arm's estimated latency after it."""
    done_path = os.path.join(directory, "round.json")
    if shared is None and os.path.exists(done_path):
        done = json.load(open(done_path))
    else:
        done = dict(shared or {})
        if shared is None:
            built = tunecore("dataset", "export-batch", "--model", args.model, "--target", "llvm", "--seed",
                             str(args.seed + r), "--out", directory, *(["--store", f"sqlite:{store}"] if r > 0 else []),
                             *export, "--json")
            timed = tunecore_module("tunecore.measure.batch", directory)
            done = {"programs": built["out"]["programs"], "built": built["out"]["built"], "export_s": built["wall_s"],
                    "time_s": timed["wall_s"], "failed": timed["out"]["failed"],
                    **({"split": built["out"]["split"]} if "split" in built["out"] else {})}
        dataset = store[:-3] + ".parquet"
        tunecore("dataset", "import-batch", directory, "--out", dataset, "--json")
        experiments.run_timed([sys.executable, "-m", "tunecore.cli", "dataset", "import", dataset, "--store",
                               f"sqlite:{store}"])
        if shared is None:  # a shared round's arm held what the uniform arm held after it: its estimate stands
            done["estimated_ms"] = estimated_ms(args.model, store)
            with open(done_path, "w") as f:
                json.dump(done, f)
    return done


def tunecore(*argv: str) -> dict:
    return tunecore_module("tunecore.cli", *argv)


def tunecore_module(module: str, *argv: str) -> dict:
    """A tunecore command's output (one JSON object, or JSON on its last line) and its wall seconds."""
    wall, stdout = experiments.run_timed([sys.executable, "-m", module, *argv])
    text = stdout.strip()
    out = json.loads(text) if text.startswith("{") and text.endswith("}") else json.loads(text.splitlines()[-1])
    return {"out": out, "wall_s": round(wall, 1)}


def estimated_ms(model: str, store_file: str) -> float | None:
    """The network's estimated latency from the store's records, as `tunecore run` reports it
    (tunecore.summary.estimated_latency); None while a task has no success."""
    from tunecore.schedulers import TaskState
    from tunecore.store.sqlite import SqliteStore
    from tunecore.summary import estimated_latency
    from tunecore.targets import resolve_target
    from tunecore.workloads import extract_tasks, load_workload

    store = SqliteStore(store_file)
    try:
        states = [TaskState(t) for t in extract_tasks(load_workload(model), resolve_target("llvm"))]
        for state in states:
            state.add_round(store.records(state.task.task_id))
    finally:
        store.close()
    total = estimated_latency(states)
    return None if total is None else 1e3 * total


def markdown(report: dict) -> str:
    builds = report["builds"]
    untuned = builds["untuned"]["latency_ms"]
    lines = [
        f"# {report['model']}: a search in rounds of batches against uniform batches and `tunecore run`",
        "",
        experiments.environment_line(report),
        "",
        f"{report['rounds']} rounds of {report['per_task']} programs per task (arms '{SPLIT}': as many in all, given "
        "out over the tasks by `export-batch --trials`); the batch arms share the first round (uniform samples). "
        "A batch is built here and timed by `python -m tunecore.measure.batch` (the device's "
        "part, here on the same CPU), so export s + time s is what a round costs. Estimated: sum of weight × best "
        "kernel latency in the arm's store, by its own timer (the batch runner's or the run's local runner's: read "
        f"across arms only the end-to-end column). End-to-end: median of {report['passes']} alternating passes over "
        "all builds in one process; spread: min-max over passes.",
        "",
        "| arm | round | programs (failed) | export s | time s | estimated ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for arm, rounds in report["batch_rounds"].items():
        for r, done in enumerate(rounds):
            shared = arm != RANDOM and r == 0
            lines.append(f"| {arm} | {r} | {done['programs']} ({done['failed']}) | "
                         f"{'shared' if shared else round(done['export_s'])} | "
                         f"{'shared' if shared else round(done['time_s'])} | {_ms(done['estimated_ms'])} |")
    run = report["run"]
    lines += [f"| {ONLINE} | - | {run['measured']} ({run['errors']}) | {run['wall_s']:.0f} (whole run) | - | "
              f"{_ms(run['estimated_latency_ms'])} |", "",
              "| build | end-to-end ms (min-max) | speedup over untuned | outputs |", "|---|---:|---:|---|"]
    for name, b in builds.items():
        check = ("reference" if name == "untuned" else
                 f"{b['tasks_tuned']}/{b['tasks_total']} tuned, max rel. error {b['max_relative_error']:.1g}")
        lines.append(f"| {name} | {b['latency_ms']:.2f} ({min(b['passes_ms']):.2f}-{max(b['passes_ms']):.2f}) | "
                     f"{untuned / b['latency_ms']:.2f} | {check} |")
    lines.append("")
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main()
