"""TLM's evaluation on networks held out of its training: top-k programs per task, and trials to reach Ansor.

The shipped weights were trained without any kernel of resnet-18, mobilenet-v2 or bert-tiny
(`tunecore tlm pretrain/finetune --exclude ...`). Per network, on this machine's default target:

1. `ansor` + `xgb`, `--ansor-trials` (1,000) trials: the baseline, its store gives its progress per trial.
2. TLM's top-k (the paper's Table): the first k = 1, 10, 32 programs the model writes per task, no online
   learning, `--cost-model none`, one round of 32 per task (`--scheduler round-robin --round-size 32`);
   the end-to-end estimate (sum over tasks of weight x best) with the best of the first k per task.
3. `tlm` + `--tlm-cost-model` (`none`) with online fine-tuning, `--tlm-trials` trials: its estimate after each
   trial, and the first trial (and wall time) at which it reaches Ansor's estimate after all its trials. With a
   cost model, tlm writes `oversample` times as many programs and measures the best-scored (e.g. `xgb` started
   from a model `tunecore costmodel train` fitted to the dataset without these networks:
   `--tlm-cost-model xgb --tlm-option cost_model.weights=FILE`).
4. `random` + `none`, `--tlm-trials` trials: the floor TLM must beat at every budget, the same seed.
5. The goal's own runs: `tlm` (as in 3) and `random` given `--goal-trials` (100) trials each, so that every task
   gets its first round within them (a 300-trial run's first 100 trials leave tasks of a large network
   unmeasured): does tlm at 100 trials reach Ansor's 1,000? With a `--tlm-cost-model`, the control: `ansor` with
   that cost model (and its options) given as many trials, which says what tlm adds to the cost model.
6. With ``--seeds N``, runs 3 and 4 again at the next N - 1 seeds, each pair's best programs re-measured
   together with Ansor's: whether TLM stays below random search beyond the spread of seeds. ``--goal-seeds N``
   does the same for the runs of 5.

Estimates in 2 and 3 compare latencies measured in different runs; the machine drifts between them, so
the best program per task of each (Ansor after all its trials, TLM's best of 32, TLM's run) is also
re-measured together, in random order over several passes, and those estimates are the headline.

    python bench/tlm.py [--networks resnet-18,mobilenet-v2,bert-tiny] [--ansor-trials 1000] [--tlm-trials 300]
                        [--weights shipped|FILE] [--seed 0] [--seeds 1] [--goal-seeds 1] [--tlm-cost-model none]
                        [--tlm-option KEY=VALUE] [--name tlm]

A network is a zoo name or any --model value with its prefix (e.g. corpus:squeezenet, a CNN no dataset holds).

Runs are cached in bench/results/tlm-work/ (delete it to start over); results in bench/results/<name>.{json,md}.
"""

from __future__ import annotations

import os
import time

import numpy as np

from tunecore import experiments
from tunecore.experiments import cached_run, command_line, environment, environment_line, run_tunecore, write_results

K = (1, 10, 32)
REMEASURE_PASSES = 4
BUDGETS = (50, 100, 200, 300, 1000)  # trials at which the runs' estimates are compared


def store_progress(store_file: str, model: str) -> dict:
    """Per task: weight and records in trial order; the estimate after each trial of the run."""
    from tunecore.store.sqlite import SqliteStore

    store = SqliteStore(store_file)
    try:
        tasks = store.get_tasks(model)
        records = {t.task_id: sorted(store.records(t.task_id), key=lambda r: (r.trial, r.measured_at)) for t in tasks}
    finally:
        store.close()
    flat = sorted((r.trial, r.measured_at, t.task_id, r.latency) for t in tasks for r in records[t.task_id])
    best = {t.task_id: float("inf") for t in tasks}
    weights = {t.task_id: t.weight for t in tasks}
    start = flat[0][1] if flat else 0.0
    curve = []  # (trials, seconds since the first record, estimate in ms or None)
    for i, (_, at, task_id, latency) in enumerate(flat):
        if latency is not None:
            best[task_id] = min(best[task_id], latency)
        ready = all(np.isfinite(v) for v in best.values())
        curve.append((i + 1, at - start, 1e3 * sum(weights[t] * best[t] for t in best) if ready else None))
    return {"tasks": tasks, "records": records, "curve": curve}


def top_k_estimates(progress: dict) -> dict:
    out = {}
    for k in K:
        total = 0.0
        for task in progress["tasks"]:
            ok = [r.latency for r in progress["records"][task.task_id][:k] if r.latency is not None]
            if not ok:
                return {**out, f"top-{k}": None}
            total += task.weight * min(ok)
        out[f"top-{k}"] = 1e3 * total
    return out


def estimate_at(curve: list, trials: int) -> float | None:
    """The run's estimate after ``trials`` trials (None: fewer trials, or a task not yet measured)."""
    return curve[trials - 1][2] if len(curve) >= trials else None


def below_at_each_trial(curve: list, floor: list) -> list[int]:
    """[trial counts at which ``curve``'s estimate is below ``floor``'s, trial counts at which both have one]:
    "at every budget", not only at the few in BUDGETS."""
    pairs = [(a[2], b[2]) for a, b in zip(curve, floor) if a[2] is not None and b[2] is not None]
    return [sum(mine < theirs for mine, theirs in pairs), len(pairs)]


def first_reaching(curve: list, goal: float) -> tuple[int, float] | None:
    for trials, seconds, estimate in curve:
        if estimate is not None and estimate <= goal:
            return trials, seconds
    return None


def remeasured(done: str, key: str, model: str, stores: dict[str, str]) -> dict:
    """Each store's best program per task, all measured together (cached under ``key``): "ms", the end-to-end
    estimates from each program's median over the passes; "passes_ms", per store one estimate per pass (a task's
    latency in that pass), whose ratios give the re-measure's own spread (None in caches made before it)."""
    def measure() -> dict:
        from tunecore.store.sqlite import SqliteStore

        opened = {name: SqliteStore(path) for name, path in stores.items()}
        try:
            tasks = opened[next(iter(opened))].get_tasks(model)
            medians = {name: 0.0 for name in stores}
            totals = {name: np.zeros(REMEASURE_PASSES) for name in stores}
            for task in tasks:
                groups = {}
                for name, store in opened.items():
                    best = store.best(task.task_id, 1)
                    groups[name] = [best[0].candidate(task)] if best else []
                passes = experiments.remeasure_passes(task, groups, passes=REMEASURE_PASSES)
                for name in stores:
                    totals[name] += task.weight * (np.array(passes[name][0]) if passes[name] else np.inf)
                    medians[name] += task.weight * (float(np.median(passes[name][0])) if passes[name] else np.inf)
        finally:
            for store in opened.values():
                store.close()
        return {"ms": {name: 1e3 * total for name, total in medians.items()},
                "passes_ms": {name: [1e3 * t for t in total] for name, total in totals.items()}}

    result = cached_run(done, key, measure)
    return result if "ms" in result else {"ms": result, "passes_ms": None}


def pass_ratios(row: dict, mine: str, theirs: str) -> list[float]:
    """``mine`` / ``theirs`` in each pass of ``row``'s re-measure ([] where it kept no passes)."""
    passes = row.get("remeasured_passes_ms")
    return [a / b for a, b in zip(passes[mine], passes[theirs])] if passes else []


def pass_span(rows: list[dict], mine: str, theirs: str) -> str:
    """" (a-b)": min-max of ``mine`` / ``theirs`` over the passes of every re-measure in ``rows`` ("" without)."""
    ratios = [r for row in rows for r in pass_ratios(row, mine, theirs)]
    return f" ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else ""


def verdict(row: dict, mine: str, theirs: str) -> str:
    """yes: ``mine`` at or below ``theirs`` in the re-measure (in every pass, where it kept them); level: below in
    some passes only; no."""
    ratios = pass_ratios(row, mine, theirs) or [row["remeasured_ms"][mine] / row["remeasured_ms"][theirs]]
    return "yes" if max(ratios) <= 1 else "level" if min(ratios) <= 1 else "no"


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--networks", default="resnet-18,mobilenet-v2,bert-tiny")
    parser.add_argument("--ansor-trials", type=int, default=1000)
    parser.add_argument("--tlm-trials", type=int, default=300)
    parser.add_argument("--goal-trials", type=int, default=100,
                        help="trials of the goal's own tlm and random runs (default 100: 1/10 of Ansor's)")
    parser.add_argument("--goal-seeds", type=int, default=1,
                        help="seeds of the goal's own runs: --seed, --seed + 1, ...")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=1,
                        help="seeds of the tlm and random runs: --seed, --seed + 1, ... (ansor and top-k: --seed only)")
    parser.add_argument("--weights", default="shipped", help="tlm's weights: shipped (default) or a file")
    parser.add_argument("--tlm-cost-model", default="none",
                        help="cost model of tlm's online runs (default none; the top-k runs always go without one)")
    parser.add_argument("--tlm-option", action="append", default=[], metavar="KEY=VALUE",
                        help="-O search.KEY=VALUE for tlm's runs (repeatable; ROLE.KEY=VALUE for another role, e.g. "
                             "cost_model.weights=FILE); they are cached apart from the runs without it, ansor's and "
                             "random search's are shared")
    parser.add_argument("--name", default="tlm", help="results file name (default tlm)")
    args = parser.parse_args()
    if args.seeds < 1 or args.goal_seeds < 1:
        parser.error(f"--seeds {args.seeds}, --goal-seeds {args.goal_seeds}: at least 1 each")
    work = os.path.join(args.out, "tlm-work")
    os.makedirs(work, exist_ok=True)
    done = os.path.join(work, "runs.json")
    report = {"command": command_line("tlm.py"), "environment": environment(), "ansor_trials": args.ansor_trials,
              "tlm_trials": args.tlm_trials, "networks": {}}
    from tunecore_tlm_generator import model as lm
    from tunecore_tlm_generator.search import SHIPPED

    weights = SHIPPED if args.weights == "shipped" else os.path.abspath(args.weights)
    metadata = lm.load(weights)[2]
    report["weights"] = {**metadata["trained_on"], "exclude": ",".join(lm.held_out_workloads(metadata)),
                         "file": os.path.basename(weights), "stage": metadata.get("stage"),
                         "round": metadata.get("round")}
    options = [o if "." in o.partition("=")[0] else f"search.{o}" for o in args.tlm_option]
    search_options = [o for o in options if o.startswith("search.")]
    def flags(chosen: list[str]) -> list[str]:
        return [a for o in chosen for a in ("-O", o)]

    tlm_args = ["-O", f"search.weights={weights}", *flags(search_options)]
    other_options = [o for o in options if o not in search_options]  # other roles': the cost model's
    online_args = [*tlm_args, *flags(other_options)]
    # in the cache keys and store names of tlm's runs: other weights, other options, other runs (a file's name
    # only); the top-k runs have no cost model, so only the search's options tell them apart
    def key(chosen: list[str]) -> str:
        return "".join("+" + o.removeprefix("search.").rsplit("/", 1)[-1] for o in chosen)

    weights_key = "" if args.weights == "shipped" else f"+{os.path.basename(weights)}"
    cost_model_key = "" if args.tlm_cost_model == "none" else f"+{args.tlm_cost_model}"
    online = weights_key + key(search_options) + cost_model_key + key(other_options)
    # oversample acts only with a cost model: the top-k runs (none) with and without it are one run
    topk_options = [o for o in search_options if not o.startswith("search.oversample=")]
    variant = weights_key + key(topk_options)
    report["tlm_options"], report["tlm_cost_model"] = options, args.tlm_cost_model
    # the control, with a cost model: ansor given it (and its options) and the goal's trials
    control = None if args.tlm_cost_model == "none" else (
        f"ansor{cost_model_key}{key(other_options)}", flags(other_options))
    goal_run = {"cost_model": args.tlm_cost_model, "tlm_args": online_args, "online": online, "control": control,
                "remeasured": f"remeasured{online}@{args.goal_trials}" + ("+ansor" if control else "")}
    for network in args.networks.split(","):
        model = network if ":" in network else f"zoo:{network}"
        prefix = os.path.join(work, network.replace(":", "_"))
        goal = args.goal_trials
        stores = {"ansor": f"{prefix}-ansor.db", "tlm-topk": f"{prefix}-tlm-topk{variant}.db",
                  "tlm": f"{prefix}-tlm{online}.db", "random": f"{prefix}-random.db"}
        runs = {
            "ansor": cached_run(done, f"{network}/ansor", lambda: run_tunecore(
                model, args.ansor_trials, args.seed, search="ansor", cost_model="xgb",
                store=f"sqlite:{stores['ansor']}")),
            "tlm-topk": cached_run(done, f"{network}/tlm-topk{variant}", lambda: run_tunecore(
                model, 32 * _task_count(model), args.seed, search="tlm", cost_model="none",
                store=f"sqlite:{stores['tlm-topk']}",
                extra_args=["-O", f"search.weights={weights}", *flags(topk_options),
                            "-O", "search.online=false", "--scheduler", "round-robin",
                            "--round-size", "32"])),
            "tlm": cached_run(done, f"{network}/tlm{online}", lambda: run_tunecore(
                model, args.tlm_trials, args.seed, search="tlm", cost_model=args.tlm_cost_model,
                store=f"sqlite:{stores['tlm']}", extra_args=online_args)),
            "random": cached_run(done, f"{network}/random", lambda: run_tunecore(
                model, args.tlm_trials, args.seed, search="random", cost_model="none",
                store=f"sqlite:{stores['random']}")),
        }
        stores.update(goal_runs(model, network, goal, args.seed, goal_run, prefix, done))
        progress = {name: store_progress(path, model) for name, path in stores.items()}
        ansor_final = progress["ansor"]["curve"][-1][2]
        reach = first_reaching(progress["tlm"]["curve"], ansor_final)
        ansor_reach = first_reaching(progress["ansor"]["curve"], ansor_final)
        started = time.perf_counter()
        together = remeasured(done, f"{network}/{goal_run['remeasured']}", model, stores)
        row = {
            "tasks": len(progress["ansor"]["tasks"]),
            "ansor_estimate_ms": ansor_final, "ansor_wall_s": runs["ansor"]["wall_s"],
            "ansor_trials_to_its_final": ansor_reach[0] if ansor_reach else None,
            "topk_estimate_ms": top_k_estimates(progress["tlm-topk"]),
            "tlm_estimate_ms": progress["tlm"]["curve"][-1][2], "tlm_wall_s": runs["tlm"]["wall_s"],
            "tlm_trials_to_ansor": reach[0] if reach else None,
            "ansor_trials_to_tlm": _trials(first_reaching(progress["ansor"]["curve"], progress["tlm"]["curve"][-1][2])),
            "tlm_seconds_to_ansor": round(reach[1], 1) if reach else None,
            "at_trials_ms": {name: {str(n): estimate_at(progress[name]["curve"], n) for n in BUDGETS}
                             for name in ("ansor", "tlm", "random")},
            "tlm_below_random": below_at_each_trial(progress["tlm"]["curve"], progress["random"]["curve"]),
            "goal": {"trials": goal, "tlm_estimate_ms": progress["tlm-goal"]["curve"][-1][2],
                     "random_estimate_ms": progress["random-goal"]["curve"][-1][2],
                     "ansor_estimate_ms": progress["ansor-goal"]["curve"][-1][2] if "ansor-goal" in stores else None,
                     "tasks_measured": {name: _tasks_measured(progress[name]) for name in ("tlm-goal", "random-goal")}},
            "remeasured_ms": together["ms"], "remeasured_passes_ms": together["passes_ms"],
            "remeasure_s": round(time.perf_counter() - started, 1),
            "written": {name: _written(runs[name]["tasks"]) for name in ("tlm-topk", "tlm")},
        }
        row["other_seeds"] = {str(seed): against_random(model, network, seed, args.tlm_trials,
                                                        (args.tlm_cost_model, online_args), online,
                                                        stores["ansor"], prefix, done)
                              for seed in range(args.seed + 1, args.seed + args.seeds)}
        row["goal_seeds"] = {str(seed): goal_at_seed(model, network, goal, seed, goal_run, stores["ansor"], prefix,
                                                     done)
                             for seed in range(args.seed + 1, args.seed + args.goal_seeds)}
        report["networks"][network] = row
    report["sentences"] = cached_run(done, "sentences/resnet-50", lambda: sentence_lengths("zoo:resnet-50"))
    write_results(args.out, args.name, report, markdown(report))


def goal_runs(model: str, network: str, goal: int, seed: int, run: dict, prefix: str, done: str,
              tag: str = "") -> dict[str, str]:
    """The goal's own runs at ``seed``: tlm (``run``'s cost model and arguments) and random search given ``goal``
    trials, and ansor given them with that cost model where ``run`` has a control; their stores (``tag`` in their
    names and cache keys: "" for the first seed)."""
    stores = {"tlm-goal": f"{prefix}-tlm{run['online']}-{goal}{tag}.db",
              "random-goal": f"{prefix}-random-{goal}{tag}.db"}
    cache_tag = tag.replace("-", "/")
    cached_run(done, f"{network}/tlm{run['online']}@{goal}{cache_tag}", lambda: run_tunecore(
        model, goal, seed, search="tlm", cost_model=run["cost_model"], store=f"sqlite:{stores['tlm-goal']}",
        extra_args=run["tlm_args"]))
    cached_run(done, f"{network}/random@{goal}{cache_tag}", lambda: run_tunecore(
        model, goal, seed, search="random", cost_model="none", store=f"sqlite:{stores['random-goal']}"))
    if run["control"]:
        name, control_args = run["control"]
        stores["ansor-goal"] = f"{prefix}-{name}-{goal}{tag}.db"
        cached_run(done, f"{network}/{name}@{goal}{cache_tag}", lambda: run_tunecore(
            model, goal, seed, search="ansor", cost_model=run["cost_model"], store=f"sqlite:{stores['ansor-goal']}",
            extra_args=control_args))
    return stores


def goal_at_seed(model: str, network: str, goal: int, seed: int, run: dict, ansor_store: str, prefix: str,
                 done: str) -> dict:
    """The goal's runs at another seed: their estimates, and their best programs re-measured with Ansor's."""
    stores = goal_runs(model, network, goal, seed, run, prefix, done, tag=f"-seed{seed}")
    together = remeasured(done, f"{network}/{run['remeasured']}/seed{seed}", model, {"ansor": ansor_store, **stores})
    return {"estimate_ms": {name: store_progress(path, model)["curve"][-1][2] for name, path in stores.items()},
            "remeasured_ms": together["ms"], "remeasured_passes_ms": together["passes_ms"]}


def against_random(model: str, network: str, seed: int, trials: int, tlm_run: tuple[str, list[str]], variant: str,
                   ansor_store: str, prefix: str, done: str) -> dict:
    """tlm (its cost model and arguments ``tlm_run``) and random search at another seed: their estimates per budget,
    and their best programs re-measured together with Ansor's (stores ``prefix``-<run>-seed<seed>.db)."""
    stores = {"tlm": f"{prefix}-tlm{variant}-seed{seed}.db", "random": f"{prefix}-random-seed{seed}.db"}
    cost_model, tlm_args = tlm_run
    cached_run(done, f"{network}/tlm{variant}/seed{seed}", lambda: run_tunecore(
        model, trials, seed, search="tlm", cost_model=cost_model, store=f"sqlite:{stores['tlm']}",
        extra_args=tlm_args))
    cached_run(done, f"{network}/random/seed{seed}", lambda: run_tunecore(
        model, trials, seed, search="random", cost_model="none", store=f"sqlite:{stores['random']}"))
    curves = {name: store_progress(path, model)["curve"] for name, path in stores.items()}
    together = remeasured(done, f"{network}/remeasured{variant}/seed{seed}", model, {"ansor": ansor_store, **stores})
    return {"at_trials_ms": {name: {str(n): estimate_at(curve, n) for n in BUDGETS} for name, curve in curves.items()},
            "tlm_below_random": below_at_each_trial(curves["tlm"], curves["random"]),
            "remeasured_ms": together["ms"], "remeasured_passes_ms": together["passes_ms"]}


def sentence_lengths(model: str) -> dict:
    """Tokens of the prompt and of the completion of one random program per sketch of every task of ``model``."""
    from tunecore_tlm_generator.sentences import Vocabulary
    from tunecore_tlm_generator.sketches import probe, sampled_decisions

    from tunecore.space import DesignSpace
    from tunecore.targets import resolve_target
    from tunecore.workloads import extract_tasks, load_workload

    vocab, prompts, completions = Vocabulary(), [], []
    for task in extract_tasks(load_workload(model), resolve_target("llvm")):
        space = DesignSpace(task)
        for i in range(len(space.sketches)):
            prompt = probe(space, i)
            if prompt.slots:
                prompts.append(len(vocab.encode(prompt.words)) + 2)  # [BOS] .. [SEP]
                completions.append(len(vocab.encode(prompt.completion_words(sampled_decisions(space, prompt, 1)))) + 1)
    return {"sketches": len(prompts), "prompt": [min(prompts), float(np.median(prompts)), max(prompts)],
            "completion": [min(completions), float(np.median(completions)), max(completions)]}


def _written(tasks: list) -> dict:
    """What the model wrote for the tasks it could write: programs, invalid ones, those whose compute location
    moved, and how many distinct new programs were measured (a task's programs are all distinct)."""
    written = [t for t in tasks if str(t["search_report"].get("tlm", "")).endswith("sketches")]
    out = {key: sum(t["search_report"].get(key, 0) for t in written) for key in ("generated", "invalid", "relocated")}
    out["measured"] = sum(t["trials"] for t in written)
    out["distinct_share"] = round(out["measured"] / out["generated"], 3) if out["generated"] else None
    return out


def _tasks_measured(progress: dict) -> int:
    """Tasks with at least one program that ran."""
    return sum(any(r.latency is not None for r in progress["records"][t.task_id]) for t in progress["tasks"])


def _option(option: str) -> str:
    """An option as `tunecore run -O` took it (reports before ROLE.KEY options hold search options without it)."""
    return option if "." in option.partition("=")[0] else f"search.{option}"


def _trials(reached: tuple[int, float] | None) -> int | None:
    return reached[0] if reached else None


def _weights_line(weights: dict) -> str:
    datasets = ", ".join(weights.get("datasets") or [weights.get("dataset", "?")])
    stage = weights.get("stage") or "finetuned"
    if weights.get("round"):
        stage += f", round {weights['round']}"
    teachers = f" and the teachers `{', '.join(weights['teachers'])}`" if weights.get("teachers") else ""
    return (f"Weights `{weights.get('file', 'tlm-cpu.pt')}` ({stage}): fine-tuned on {weights['programs']} best "
            f"programs of {len(weights['workloads'])} workloads of `{datasets}`{teachers}; excluded: "
            f"`{weights['exclude']}`.")


def _task_count(model: str) -> int:
    from tunecore.targets import resolve_target
    from tunecore.workloads import extract_tasks, load_workload

    return len(extract_tasks(load_workload(model), resolve_target("llvm")))


def goal_markdown(report: dict) -> list[str]:
    """The goal's own runs (tlm and random search given the goal's trials) against Ansor's 1,000."""
    from tunecore.cli.render import cell

    rows = {network: row for network, row in report["networks"].items() if "goal" in row}
    if not rows:
        return []
    goal = next(iter(rows.values()))["goal"]["trials"]
    lines = ["", f"## The goal: tlm given {goal} trials against ansor+xgb's {report['ansor_trials']}", "",
             f"Runs of exactly {goal} trials (every task gets its first round within them). Estimates as each run "
             "measured them; re-measured: the best programs of every run of the network measured together (4 passes "
             "in random order; in parentheses the ratio's min-max over the passes, a pass's estimate from the latency "
             "of each task's program in it). Reached: tlm's re-measured latency at or below ansor's in every pass "
             "(level: in some).", "",
             f"| network | tasks measured (tlm / random) | ansor @{report['ansor_trials']} (ms) | tlm @{goal} (ms) | "
             f"random @{goal} (ms) | re-measured: tlm @{goal} / ansor | tlm @{goal} / random @{goal} | reached |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    control = []  # ansor given tlm's cost model (and its options) and the goal's trials, where the report has it
    for network, row in rows.items():
        g, r = row["goal"], row["remeasured_ms"]
        measured = g["tasks_measured"]
        versus_ansor = r["tlm-goal"] / r["ansor"]
        lines.append(f"| {network} | {measured['tlm-goal']} / {measured['random-goal']} of {row['tasks']} | "
                     f"{cell(row['ansor_estimate_ms'])} | {cell(g['tlm_estimate_ms'])} | "
                     f"{cell(g['random_estimate_ms'])} | {versus_ansor:.2f}{pass_span([row], 'tlm-goal', 'ansor')} | "
                     f"{r['tlm-goal'] / r['random-goal']:.2f} | {verdict(row, 'tlm-goal', 'ansor')} |")
        if "ansor-goal" in r:
            control.append(f"| {network} | {cell(g['ansor_estimate_ms'])} | {r['ansor-goal'] / r['ansor']:.2f} | "
                           f"{r['tlm-goal'] / r['ansor-goal']:.2f}{pass_span([row], 'tlm-goal', 'ansor-goal')} |")
    lines += _goal_seeds_markdown(report, goal)
    if control:
        lines += ["", f"The control: ansor with tlm's cost model (`{report['tlm_cost_model']}`, the same options) "
                  f"given {goal} trials, re-measured with the others.", "",
                  f"| network | ansor + that cost model @{goal} (ms) | re-measured: it / ansor "
                  f"@{report['ansor_trials']} | tlm @{goal} / it |", "|---|---:|---:|---:|", *control]
    return lines


def _goal_seeds_markdown(report: dict, goal: int) -> list[str]:
    """The goal's runs over their seeds (min-max), re-measured per seed with Ansor's best programs."""
    rows = {network: [{"estimate_ms": {"tlm-goal": row["goal"]["tlm_estimate_ms"]},
                       "remeasured_ms": row["remeasured_ms"],
                       "remeasured_passes_ms": row.get("remeasured_passes_ms")}, *row["goal_seeds"].values()]
            for network, row in report["networks"].items() if row.get("goal_seeds")}
    if not rows:
        return []

    def span(values: list) -> str:
        low, high = f"{min(values):.2f}", f"{max(values):.2f}"
        return low if low == high else f"{low}-{high}"

    lines = ["", f"Over seeds (min-max; each seed's best programs re-measured together with ansor's @"
             f"{report['ansor_trials']}; in parentheses min-max over the seeds' passes):", "",
             f"| network | seeds | tlm @{goal} estimate (ms) | tlm / ansor | tlm / random @{goal} | "
             f"ansor + tlm's cost model @{goal} / ansor | tlm / it |", "|---|---:|---:|---:|---:|---:|---:|"]
    for network, seeds in rows.items():
        measured = [s["remeasured_ms"] for s in seeds]
        control = all("ansor-goal" in m for m in measured)
        lines.append(f"| {network} | {len(seeds)} | {span([s['estimate_ms']['tlm-goal'] for s in seeds])} | "
                     f"{span([m['tlm-goal'] / m['ansor'] for m in measured])}{pass_span(seeds, 'tlm-goal', 'ansor')} | "
                     f"{span([m['tlm-goal'] / m['random-goal'] for m in measured])} | "
                     f"{span([m['ansor-goal'] / m['ansor'] for m in measured]) if control else '-'} | "
                     + (f"{span([m['tlm-goal'] / m['ansor-goal'] for m in measured])}"
                        f"{pass_span(seeds, 'tlm-goal', 'ansor-goal')} |" if control else "- |"))
    return lines


def span(values: list, form=None) -> str:
    """"low-high" of ``values`` written by ``form`` (default: the tables' cell), one number where they agree; "-"
    where one is missing."""
    from tunecore.cli.render import cell

    form = form or cell
    if not values or None in values:
        return "-"
    low, high = form(min(values)), form(max(values))
    return low if low == high else f"{low}-{high}"


def seeds_markdown(report: dict) -> list[str]:
    """tlm against random search over the seeds (min-max), where the report has more than one."""
    ratio = "{:.2f}".format
    # the first seed's runs are the row's own
    rows = {network: [row, *row["other_seeds"].values()] for network, row in report["networks"].items()
            if row.get("other_seeds")}
    if not rows:
        return []
    budgets = [str(n) for n in BUDGETS if n <= report["tlm_trials"]]
    lines = ["", "## tlm against random search over seeds", "",
             "Estimates (ms, as each run measured them), min-max over the seeds; `tlm below`: in how many seeds "
             "tlm's estimate is under random search's at that budget.", "",
             "| network | seeds | run | " + " | ".join(f"{n} trials" for n in budgets) + " |",
             "|---|---:|---|" + "---:|" * len(budgets)]
    for network, seeds in rows.items():
        for name in ("tlm", "random"):
            cells = [span([s["at_trials_ms"][name][n] for s in seeds]) for n in budgets]
            lines.append(f"| {network} | {len(seeds)} | {name} | " + " | ".join(cells) + " |")
        below = []
        for n in budgets:
            pairs = [(s["at_trials_ms"]["tlm"][n], s["at_trials_ms"]["random"][n]) for s in seeds]
            pairs = [(t, r) for t, r in pairs if t is not None and r is not None]
            below.append(f"{sum(t < r for t, r in pairs)} of {len(pairs)}" if pairs else "-")
        lines.append(f"| {network} | {len(seeds)} | tlm below | " + " | ".join(below) + " |")
    lines += ["", "Best programs re-measured together, per seed (4 passes in random order), min-max over the seeds:",
              "", "| network | seeds | tlm / random | tlm / ansor+xgb |", "|---|---:|---:|---:|"]
    for network, seeds in rows.items():
        measured = [s["remeasured_ms"] for s in seeds]
        lines.append(f"| {network} | {len(seeds)} | {span([m['tlm'] / m['random'] for m in measured], ratio)} | "
                     f"{span([m['tlm'] / m['ansor'] for m in measured], ratio)} |")
    return lines


def markdown(report: dict) -> str:
    from tunecore.cli.render import cell

    lines = ["# TLM on networks held out of its training", "",
             environment_line(report), "", _weights_line(report["weights"])
             + (f" tlm's runs with `{' '.join('-O ' + _option(o) for o in report['tlm_options'])}`."
                if report.get("tlm_options") else "")
             + (f" tlm's online runs with `--cost-model {report['tlm_cost_model']}` (the top-k runs without one)."
                if report.get("tlm_cost_model", "none") != "none" else ""), "",
             "## Top-k: the first k programs the model writes per task (no online learning)", "",
             "Share = Ansor's estimate / TLM's (above 100%: TLM's programs are faster). Estimates are sums of "
             "weight x best latency over the network's tasks, as each run measured them.", "",
             f"| network | tasks | ansor+xgb {report['ansor_trials']} trials (ms) | "
             + " | ".join(f"top-{k} (ms) | share" for k in K) + " |",
             "|---|---:|---:|" + "---:|---:|" * len(K)]
    for network, row in report["networks"].items():
        cells = []
        for k in K:
            value = row["topk_estimate_ms"].get(f"top-{k}")
            cells += [cell(value), f"{100 * row['ansor_estimate_ms'] / value:.0f}%" if value else "-"]
        lines.append(f"| {network} | {row['tasks']} | {cell(row['ansor_estimate_ms'])} | " + " | ".join(cells) + " |")
    lines += ["", f"## Trials to reach Ansor's {report['ansor_trials']}-trial estimate "
              f"(`tlm` with online fine-tuning, up to {report['tlm_trials']} trials)", "",
              "| network | ansor: trials to its final estimate | ansor wall (s) | tlm: trials to reach it | "
              "tlm seconds to reach it | tlm estimate after all its trials (ms) | trials ratio | "
              "ansor: trials to reach tlm's final estimate |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for network, row in report["networks"].items():
        ratio = (f"1/{row['ansor_trials_to_its_final'] / row['tlm_trials_to_ansor']:.1f}"
                 if row["tlm_trials_to_ansor"] else f"not reached in {report['tlm_trials']}")
        lines.append(f"| {network} | {row['ansor_trials_to_its_final']} | {cell(row['ansor_wall_s'])} | "
                     f"{cell(row['tlm_trials_to_ansor'])} | {cell(row['tlm_seconds_to_ansor'])} | "
                     f"{cell(row['tlm_estimate_ms'])} | {ratio} | {cell(row.get('ansor_trials_to_tlm'))} |")
    lines += ["", "## Estimates after the same number of trials (ms, as each run measured them)", "",
              f"`random`: random search with the same seed, up to {report['tlm_trials']} trials.", "",
              "| network | run | " + " | ".join(f"{n} trials" for n in BUDGETS) + " |",
              "|---|---|" + "---:|" * len(BUDGETS)]
    for network, row in report["networks"].items():
        for name, at in row.get("at_trials_ms", {}).items():
            lines.append(f"| {network} | {name} | " + " | ".join(cell(at[str(n)]) for n in BUDGETS) + " |")
    below = {network: [s["tlm_below_random"] for s in (row, *row.get("other_seeds", {}).values())
                       if "tlm_below_random" in s] for network, row in report["networks"].items()}
    if any(below.values()):
        lines += ["", "tlm's estimate below random search's, at every trial count where both have one (per seed): "
                  + "; ".join(f"{network} " + ", ".join(f"{b} of {n}" for b, n in counts)
                              for network, counts in below.items() if counts) + "."]
    lines += ["", "## The best programs of each, measured together (ms; 4 passes in random order)", "",
              "| network | ansor+xgb | tlm top-32 | tlm run | random | tlm top-32 / ansor | tlm run / ansor | "
              "tlm run / random |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for network, row in report["networks"].items():
        r = row["remeasured_ms"]
        versus_random = f"{r['tlm'] / r['random']:.2f}" if "random" in r else "-"
        lines.append(f"| {network} | {cell(r['ansor'])} | {cell(r['tlm-topk'])} | {cell(r['tlm'])} | "
                     f"{cell(r.get('random'))} | {r['tlm-topk'] / r['ansor']:.2f} | {r['tlm'] / r['ansor']:.2f} | "
                     f"{versus_random} |")
    lines += goal_markdown(report)
    lines += seeds_markdown(report)
    lines += ["", "## What the model wrote (tasks with decisions)", "",
              "| network | run | programs written | invalid | compute location moved | measured (distinct, new) | "
              "distinct share |", "|---|---|---:|---:|---:|---:|---:|"]
    for network, row in report["networks"].items():
        for name, w in row["written"].items():
            lines.append(f"| {network} | {name} | {w['generated']} | {w['invalid']} | {w['relocated']} | "
                         f"{w['measured']} | {cell(w['distinct_share'])} |")
    if "sentences" in report:
        n = report["sentences"]
        lines += ["", f"Sentence lengths on resnet-50's tasks ({n['sketches']} sketches with decisions; "
                  f"min / median / max tokens): prompt {' / '.join(map(cell, n['prompt']))}, completion "
                  f"{' / '.join(map(cell, n['completion']))}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
