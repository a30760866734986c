"""Ansor's warm-up (every task's first round alike) against first rounds sized by each task's share of the work.

At a small budget the warm-up is most of the run: 100 trials over resnet-18's 22 tasks are rounds of 4, 88 of
them spent before the task scheduler chooses, 28 on its 7 tasks of under 1% of the FLOPs. Per network and seed,
`tunecore run --model M --search S --cost-model C --trials N` twice, each into its own store: with
`--scheduler gradient-flops-warmup` ("sized": a task's first round the round size x tasks x its share of weight x
FLOPs, 1 to the round size) and with `--scheduler gradient` ("even": the default, Ansor's). Then each run's best
program per task is re-measured beside the other's and the `--reference` run's (by default ansor+xgb given
1,000 trials, seed 0, once per network: issue 38's goal for tlm at 100 trials), 4 passes in
random order (bench/tlm.py's `remeasured`); the re-measured end-to-end estimates are the headline, with their
ratios in every pass.

    python bench/warmup.py [--networks resnet-18,mobilenet-v2] [--search tlm] [--cost-model xgb]
                           [--trials 100] [--seeds 2,3] [-O ROLE.KEY=VALUE ...] [--reference ansor:xgb:1000[:SCHEDULER]]
                           [--name warmup]

e.g. tlm with xgb trained on the dataset without these networks (the tlm README's command):
`--search tlm --cost-model xgb -O xgb.weights=FILE -O search.oversample=16`.
Runs are cached in bench/results/warmup-work/ (delete it to start over); results in bench/results/<name>.{json,md}.
"""

from __future__ import annotations

import os

from tlm import remeasured, store_progress

from tunecore import experiments
from tunecore.experiments import cached_run, command_line, environment, environment_line, run_tunecore, write_results

SCHEDULERS = {"sized": "gradient-flops-warmup", "even": "gradient"}


def warmup_trials(progress: dict) -> int:
    """Trials measured when the last task got its first program."""
    firsts = [records[0].trial for records in progress["records"].values() if records]
    start = min(r.trial for records in progress["records"].values() for r in records)
    return max(firsts) - start + 1


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--networks", default="resnet-18,mobilenet-v2")
    parser.add_argument("--search", default="tlm")
    parser.add_argument("--cost-model", default="xgb")
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seeds", default="2,3", help="comma-separated")
    parser.add_argument("--option", "-O", action="append", default=[], metavar="ROLE.KEY=VALUE")
    parser.add_argument("--reference", default="ansor:xgb:1000",
                        help="SEARCH:COST_MODEL:TRIALS[:SCHEDULER] (seed 0; scheduler default gradient)")
    parser.add_argument("--name", default="warmup")
    args = parser.parse_args()
    reference = args.reference.split(":")
    if len(reference) not in (3, 4) or not reference[2].isdigit():
        parser.error(f"--reference {args.reference}: expected SEARCH:COST_MODEL:TRIALS[:SCHEDULER], "
                     "e.g. ansor:xgb:1000")
    reference_scheduler = reference[3] if len(reference) == 4 else "gradient"
    seeds = [int(s) for s in args.seeds.split(",")]
    options = [a for o in args.option for a in ("-O", o)]
    config = f"{args.search}+{args.cost_model}" + "".join(f"+{o.rsplit('/', 1)[-1]}" for o in args.option)
    work = os.path.join(args.out, "warmup-work")
    os.makedirs(work, exist_ok=True)
    done = os.path.join(work, "runs.json")
    report = {"command": command_line("warmup.py"), "environment": environment(), "search": args.search,
              "cost_model": args.cost_model, "options": args.option, "trials": args.trials,
              "reference": args.reference, "rows": []}
    for network in args.networks.split(","):
        model = network if ":" in network else f"zoo:{network}"
        reference_store = os.path.join(work, f"{network.replace(':', '_')}-{args.reference.replace(':', '-')}.db")
        cached_run(done, f"{network}/{args.reference}", lambda: run_tunecore(
            model, int(reference[2]), 0, search=reference[0], cost_model=reference[1],
            store=f"sqlite:{reference_store}", extra_args=["--scheduler", reference_scheduler]))
        for seed in seeds:
            stores = {}
            for label, scheduler in SCHEDULERS.items():
                stores[label] = os.path.join(work, f"{network.replace(':', '_')}-{scheduler}-s{seed}.db")
                cached_run(done, f"{network}/{config}@{args.trials}/{scheduler}/seed{seed}", lambda: run_tunecore(
                    model, args.trials, seed, search=args.search, cost_model=args.cost_model,
                    store=f"sqlite:{stores[label]}", extra_args=[*options, "--scheduler", scheduler]))
            progress = {name: store_progress(path, model) for name, path in stores.items()}
            together = remeasured(done, f"{network}/{config}@{args.trials}/remeasured/seed{seed}", model,
                                  {**stores, "reference": reference_store})
            passes = together["passes_ms"]
            report["rows"].append({
                "network": network, "seed": seed, "tasks": len(progress["even"]["tasks"]),
                "estimate_ms": {name: p["curve"][-1][2] for name, p in progress.items()},
                "warmup_trials": {name: warmup_trials(p) for name, p in progress.items()},
                "remeasured_ms": together["ms"], "remeasured_passes_ms": passes,
                "ratio_per_pass": [a / b for a, b in zip(passes["sized"], passes["even"])],
                "to_reference_per_pass": {name: [a / b for a, b in zip(passes[name], passes["reference"])]
                                          for name in SCHEDULERS}})
    write_results(args.out, args.name, report, markdown(report))


def markdown(report: dict) -> str:
    flags = " ".join(f"-O {o}" for o in report["options"])
    lines = ["# First rounds sized by a task's share of the work, against Ansor's even warm-up", "",
             environment_line(report), "",
             f"Runs: `tunecore run --search {report['search']} --cost-model {report['cost_model']} {flags} "
             f"--trials {report['trials']}` with `--scheduler gradient-flops-warmup` (sized) and `gradient` (even, "
             "the default: Ansor's). "
             "Warm-up: trials measured when the last task got its first program. Re-measured: both runs' best "
             "program per task measured together, 4 passes in random order; the ratio sized / even in each pass "
             f"(below 1: the sized warm-up's programs are faster), and each / the reference `{report['reference']}` "
             "(search:cost model:trials[:scheduler], seed 0; without a scheduler the default) re-measured with "
             "them.", "",
             "| network | seed | tasks | warm-up trials (sized / even) | estimate sized / even (ms) | "
             "re-measured sized / even / reference (ms) | sized / even per pass | faster | sized / reference | "
             "even / reference |",
             "|---|---:|---:|---|---|---|---|---|---|---|"]

    def span(ratios: list[float]) -> str:
        return f"{min(ratios):.3f}-{max(ratios):.3f}"

    for row in report["rows"]:
        w, e, r, ratios = row["warmup_trials"], row["estimate_ms"], row["remeasured_ms"], row["ratio_per_pass"]
        verdict = "sized" if max(ratios) < 1 else "even" if min(ratios) > 1 else "level"
        to_reference = row["to_reference_per_pass"]
        lines.append(f"| {row['network']} | {row['seed']} | {row['tasks']} | {w['sized']} / {w['even']} | "
                     f"{e['sized']:.2f} / {e['even']:.2f} | "
                     f"{r['sized']:.2f} / {r['even']:.2f} / {r['reference']:.2f} | "
                     f"{span(ratios)} | {verdict} | {span(to_reference['sized'])} | {span(to_reference['even'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
