"""tlm against random search on CNNs that no dataset and no weights file holds, as a new user brings one.

Issue 38's first test: on a network tlm has not seen, the shipped weights must beat random search at every budget.
Per network and seed: random search and tlm (shipped weights, `--cost-model none`, as `tunecore run --search tlm`
runs it; each ``--variant`` with its own -O search options) given ``--trials`` trials each. Reported per run pair:
at how many trial counts tlm's estimate is below random search's (of those where both runs have one: every task
measured), the estimates at a few budgets, and the two runs' best programs per task re-measured together
(4 passes in random order; ratios per pass give the re-measure's own spread).

    python bench/tlm_unseen.py [--networks corpus:squeezenet,corpus:googlenet] [--trials 256] [--seeds 3]
                               [--variant NAME=KEY=VALUE,KEY=VALUE ...] [--name tlm_unseen]

``--variant as-shipped=`` (the default) runs tlm with its defaults; e.g. ``--variant rewrite-0=rewrite=0`` adds a run
with ``-O search.rewrite=0``. Runs are cached in bench/results/tlm-work/ (random search's are shared by every
variant); results in bench/results/<name>.{json,md}.
"""

from __future__ import annotations

import os

from tlm import below_at_each_trial, estimate_at, pass_ratios, remeasured, span, store_progress

from tunecore import experiments
from tunecore.experiments import cached_run, command_line, environment, environment_line, run_tunecore, write_results

BUDGETS = (64, 96, 128, 192, 256, 384, 512)


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--networks", default="corpus:squeezenet,corpus:googlenet")
    parser.add_argument("--trials", type=int, default=256)
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0 .. N-1")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE,...",
                        help="a tlm run with these -O search options (repeatable; default: as-shipped=)")
    parser.add_argument("--name", default="tlm_unseen", help="results file name (default tlm_unseen)")
    args = parser.parse_args()
    variants = {}
    for spec in args.variant or ["as-shipped="]:
        name, _, options = spec.partition("=")
        if "=" not in spec or not name or any("=" not in o for o in options.split(",") if o):
            parser.error(f"--variant {spec}: NAME=KEY=VALUE,KEY=VALUE (or NAME= for tlm's defaults)")
        variants[name] = [o for o in options.split(",") if o]
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: at least 1")
    work = os.path.join(args.out, "tlm-work")
    os.makedirs(work, exist_ok=True)
    done = os.path.join(work, "runs.json")
    report = {"command": command_line("tlm_unseen.py"), "environment": environment(), "trials": args.trials,
              "variants": variants, "networks": {}}
    for network in args.networks.split(","):
        prefix = os.path.join(work, f"{network.replace(':', '_')}-{args.trials}")
        seeds = {}
        for seed in range(args.seeds):
            stores = {"random": f"{prefix}-random-seed{seed}.db"}
            cached_run(done, f"{network}/random@{args.trials}/seed{seed}", lambda: run_tunecore(
                network, args.trials, seed, search="random", cost_model="none", store=f"sqlite:{stores['random']}"))
            runs = {}
            for name, options in variants.items():
                key = "".join(f"+{o}" for o in options)
                stores[name] = f"{prefix}-tlm{key}-seed{seed}.db"
                runs[name] = cached_run(done, f"{network}/tlm{key}@{args.trials}/seed{seed}", lambda: run_tunecore(
                    network, args.trials, seed, search="tlm", cost_model="none", store=f"sqlite:{stores[name]}",
                    extra_args=[a for o in options for a in ("-O", f"search.{o}")]))
            curves = {name: store_progress(path, network)["curve"] for name, path in stores.items()}
            together = remeasured(done, f"{network}/unseen@{args.trials}/{'+'.join(variants)}/seed{seed}", network,
                                  stores)
            seeds[str(seed)] = {
                "at_trials_ms": {name: {str(n): estimate_at(curve, n) for n in BUDGETS if n <= args.trials}
                                 for name, curve in curves.items()},
                "below_random": {name: below_at_each_trial(curves[name], curves["random"]) for name in variants},
                "wall_s": {name: run["wall_s"] for name, run in runs.items()},
                "invalid": {name: sum(t.get("search_report", {}).get("invalid", 0) for t in run["tasks"])
                            for name, run in runs.items()},
                "remeasured_ms": together["ms"], "remeasured_passes_ms": together["passes_ms"]}
        report["networks"][network] = {"tasks": len(store_progress(stores["random"], network)["tasks"]),
                                       "seeds": seeds}
    write_results(args.out, args.name, report, markdown(report))


def markdown(report: dict) -> str:
    ratio = "{:.2f}".format
    budgets = [str(n) for n in BUDGETS if n <= report["trials"]]
    variants = ", ".join(f"`{name}`: " + (" ".join(f"`-O search.{o}`" for o in options) or "tlm's defaults")
                         for name, options in report["variants"].items())
    lines = ["# tlm against random search on CNNs no dataset holds", "", environment_line(report), "",
             f"Shipped weights, `--cost-model none`, {report['trials']} trials per run; tlm runs: {variants}.", "",
             "## Below random search", "",
             "Per seed: at how many trial counts tlm's estimate (sum over tasks of weight x best latency, as the run "
             "measured it) is below random search's, of those where both have one. Re-measured: each seed's best "
             "programs of tlm and random measured together, tlm / random (min-max over seeds; in parentheses "
             "min-max over every pass of every seed).", "",
             "| network | tasks | tlm run | below random, per seed | re-measured tlm / random | seeds below in "
             "every pass | invalid programs |", "|---|---:|---|---|---:|---:|---:|"]
    for network, row in report["networks"].items():
        seeds = list(row["seeds"].values())
        for name in report["variants"]:
            below = " / ".join(f"{s['below_random'][name][0]} of {s['below_random'][name][1]}" for s in seeds)
            measured = [s["remeasured_ms"][name] / s["remeasured_ms"]["random"] for s in seeds]
            passes = [r for s in seeds for r in pass_ratios(s, name, "random")]
            every = sum(bool(pass_ratios(s, name, "random")) and max(pass_ratios(s, name, "random")) < 1
                        for s in seeds)
            lines.append(f"| {network} | {row['tasks']} | {name} | {below} | {span(measured, ratio)}"
                         + (f" ({min(passes):.2f}-{max(passes):.2f})" if passes else "")
                         + f" | {every} of {len(seeds)} | {sum(s['invalid'][name] for s in seeds)} |")
    lines += ["", "## Estimates after the same number of trials", "",
              "ms, as each run measured them, min-max over the seeds; `below`: in how many seeds tlm's is the lower.",
              "", "| network | run | " + " | ".join(f"{n} trials" for n in budgets) + " |",
              "|---|---|" + "---:|" * len(budgets)]
    for network, row in report["networks"].items():
        seeds = list(row["seeds"].values())
        for name in ["random", *report["variants"]]:
            cells = [span([s["at_trials_ms"][name][n] for s in seeds]) for n in budgets]
            lines.append(f"| {network} | {name} | " + " | ".join(cells) + " |")
            if name == "random":
                continue
            below = []
            for n in budgets:
                pairs = [(s["at_trials_ms"][name][n], s["at_trials_ms"]["random"][n]) for s in seeds]
                pairs = [(t, r) for t, r in pairs if t is not None and r is not None]
                below.append(f"{sum(t < r for t, r in pairs)} of {len(pairs)}" if pairs else "-")
            lines.append(f"| {network} | {name} below | " + " | ".join(below) + " |")
    lines += ["", "Wall time per tlm run (s, min-max over seeds): " + "; ".join(
        f"{network} {name} {span([s['wall_s'][name] for s in row['seeds'].values()], '{:.0f}'.format)}"
        for network, row in report["networks"].items() for name in report["variants"]) + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
