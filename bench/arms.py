"""Two configurations of `tunecore run` against each other: the same seeds, their best programs re-measured together.

Per network and seed, `tunecore run --model M --search S --cost-model C [-O ...] --trials N` once per arm, each
arm adding its own arguments (`--arm LABEL=ARGS`, two of them) and writing its own store. Then both runs' best
program per task is re-measured beside the other's and the `--reference` run's (by default ansor+xgb given 1,000
trials, seed 0, once per network: issue 38's goal for tlm at 100 trials), 4 passes in random order
(bench/tlm.py's `remeasured`); the re-measured end-to-end estimates are the headline, with their ratios in every
pass. Warm-up: trials measured when the last task got its first program.

    python bench/arms.py [--networks resnet-18,mobilenet-v2] [--search tlm] [--cost-model xgb]
                         [--trials 100] [--seeds 2,3] [-O ROLE.KEY=VALUE ...]
                         [--arm LABEL="ARGS" --arm LABEL="ARGS"] [--reference ansor:xgb:1000[:SCHEDULER]] [--name arms]

The default arms are Ansor's warm-up (every task's first round alike) against first rounds sized by each task's
share of the work: `--arm sized="--scheduler gradient-flops-warmup" --arm even="--scheduler gradient"`. Two xgb
files in tlm's runs: `--search tlm --cost-model xgb -O search.oversample=16 --arm rank="-O xgb.weights=A.json"
--arm regression="-O xgb.weights=B.json"`.
Runs are cached in bench/results/arms-work/ (delete it to start over); results in bench/results/<name>.{json,md}.
"""

from __future__ import annotations

import os
import shlex

from tlm import remeasured, store_progress

from tunecore import experiments
from tunecore.experiments import cached_run, command_line, environment, environment_line, run_tunecore, write_results

DEFAULT_ARMS = ["sized=--scheduler gradient-flops-warmup", "even=--scheduler gradient"]


def warmup_trials(progress: dict) -> int:
    """Trials measured when the last task got its first program."""
    firsts = [records[0].trial for records in progress["records"].values() if records]
    start = min(r.trial for records in progress["records"].values() for r in records)
    return max(firsts) - start + 1


def parse_arms(values: list[str]) -> dict[str, list[str]] | str:
    """{label: extra `tunecore run` arguments} from LABEL=ARGS, or what is wrong with them."""
    arms = {}
    for value in values:
        label, _, rest = value.partition("=")
        try:
            words = shlex.split(rest)
        except ValueError as error:
            return f"--arm {value}: {error}"
        if not label or not label.replace("-", "").replace("_", "").isalnum() or label == "reference":
            return f"--arm {value}: expected LABEL=ARGS with a label of letters, digits, - or _ other than 'reference'"
        if label in arms:
            return f"--arm {label}: given twice"
        arms[label] = words
    if len(arms) != 2:
        return f"expected two --arm options, got {len(arms)}"
    return arms


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--networks", default="resnet-18,mobilenet-v2")
    parser.add_argument("--search", default="tlm")
    parser.add_argument("--cost-model", default="xgb")
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seeds", default="2,3", help="comma-separated")
    parser.add_argument("--option", "-O", action="append", default=[], metavar="ROLE.KEY=VALUE",
                        help="for both arms")
    parser.add_argument("--arm", action="append", metavar='LABEL="ARGS"',
                        help="an arm: its label and the `tunecore run` arguments it adds (twice; default: "
                             + " and ".join(repr(a) for a in DEFAULT_ARMS) + ")")
    parser.add_argument("--reference", default="ansor:xgb:1000",
                        help="SEARCH:COST_MODEL:TRIALS[:SCHEDULER] (seed 0; scheduler default gradient)")
    parser.add_argument("--name", default="arms")
    args = parser.parse_args()
    arms = parse_arms(args.arm or DEFAULT_ARMS)
    if isinstance(arms, str):
        parser.error(arms)
    reference = args.reference.split(":")
    if len(reference) not in (3, 4) or not reference[2].isdigit():
        parser.error(f"--reference {args.reference}: expected SEARCH:COST_MODEL:TRIALS[:SCHEDULER], "
                     "e.g. ansor:xgb:1000")
    reference_scheduler = reference[3] if len(reference) == 4 else "gradient"
    seeds = [int(s) for s in args.seeds.split(",")]
    options = [a for o in args.option for a in ("-O", o)]
    config = f"{args.search}+{args.cost_model}" + "".join(f"+{o.rsplit('/', 1)[-1]}" for o in args.option)
    work = os.path.join(args.out, "arms-work")
    os.makedirs(work, exist_ok=True)
    done = os.path.join(work, "runs.json")
    first, second = arms
    report = {"command": command_line("arms.py"), "environment": environment(), "search": args.search,
              "cost_model": args.cost_model, "options": args.option, "trials": args.trials,
              "arms": {label: shlex.join(words) for label, words in arms.items()},
              "reference": args.reference, "rows": []}
    for network in args.networks.split(","):
        model = network if ":" in network else f"zoo:{network}"
        reference_store = os.path.join(work, f"{network.replace(':', '_')}-{args.reference.replace(':', '-')}.db")
        cached_run(done, f"{network}/{args.reference}", lambda: run_tunecore(
            model, int(reference[2]), 0, search=reference[0], cost_model=reference[1],
            store=f"sqlite:{reference_store}", extra_args=["--scheduler", reference_scheduler]))
        for seed in seeds:
            stores = {}
            for label, words in arms.items():
                stores[label] = os.path.join(work, f"{network.replace(':', '_')}-{label}-s{seed}.db")
                cached_run(done, f"{network}/{config}+{shlex.join(words)}@{args.trials}/seed{seed}",
                           lambda: run_tunecore(model, args.trials, seed, search=args.search,
                                                cost_model=args.cost_model, store=f"sqlite:{stores[label]}",
                                                extra_args=[*options, *words]))
            progress = {label: store_progress(path, model) for label, path in stores.items()}
            together = remeasured(done, f"{network}/{config}+{'+'.join(report['arms'].values())}@{args.trials}"
                                        f"/remeasured/seed{seed}", model, {**stores, "reference": reference_store})
            passes = together["passes_ms"]
            report["rows"].append({
                "network": network, "seed": seed, "tasks": len(progress[first]["tasks"]),
                "estimate_ms": {label: p["curve"][-1][2] for label, p in progress.items()},
                "warmup_trials": {label: warmup_trials(p) for label, p in progress.items()},
                "remeasured_ms": together["ms"], "remeasured_passes_ms": passes,
                "ratio_per_pass": [a / b for a, b in zip(passes[first], passes[second])],
                "to_reference_per_pass": {label: [a / b for a, b in zip(passes[label], passes["reference"])]
                                          for label in arms}})
    write_results(args.out, args.name, report, markdown(report))


def markdown(report: dict) -> str:
    flags = " ".join(f"-O {o}" for o in report["options"])
    (a, a_args), (b, b_args) = report["arms"].items()
    lines = [f"# {a} against {b}: `tunecore run` two ways, re-measured together", "",
             environment_line(report), "",
             f"Runs: `tunecore run --search {report['search']} --cost-model {report['cost_model']} {flags} "
             f"--trials {report['trials']}`, with `{a_args}` ({a}) and with `{b_args}` ({b}). "
             "Warm-up: trials measured when the last task got its first program. Re-measured: both runs' best "
             "program per task measured together, 4 passes in random order; the ratio "
             f"{a} / {b} in each pass (below 1: {a}'s programs are faster), and each / the reference "
             f"`{report['reference']}` (search:cost model:trials[:scheduler], seed 0; without a scheduler the "
             "default) re-measured with them.", "",
             f"| network | seed | tasks | warm-up trials ({a} / {b}) | estimate {a} / {b} (ms) | "
             f"re-measured {a} / {b} / reference (ms) | {a} / {b} per pass | faster | {a} / reference | "
             f"{b} / reference |",
             "|---|---:|---:|---|---|---|---|---|---|---|"]

    def span(ratios: list[float]) -> str:
        return f"{min(ratios):.3f}-{max(ratios):.3f}"

    for row in report["rows"]:
        w, e, r, ratios = row["warmup_trials"], row["estimate_ms"], row["remeasured_ms"], row["ratio_per_pass"]
        verdict = a if max(ratios) < 1 else b if min(ratios) > 1 else "level"
        to_reference = row["to_reference_per_pass"]
        lines.append(f"| {row['network']} | {row['seed']} | {row['tasks']} | {w[a]} / {w[b]} | "
                     f"{e[a]:.2f} / {e[b]:.2f} | {r[a]:.2f} / {r[b]:.2f} / {r['reference']:.2f} | "
                     f"{span(ratios)} | {verdict} | {span(to_reference[a])} | {span(to_reference[b])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
