"""Which objective should the `xgb` cost model use? Pack-sum (Ansor) vs pairwise ranking, on real records.

Reads a tunecore store with measured records of several tasks (e.g. filled by `tunecore run --search
random` on a few operators), then for each objective:

- within-task: train on a random half of every task's records, rank the other half;
- cross-task: train on every task but one, rank the left-out task (the model has never seen it).

Quality is Ansor's "peak score" of the ranking: best latency among the model's top-k divided into the
best latency of the held-out set (1.0 = the model's top-k contains the best program), plus Spearman's
rank correlation. Also times `predict` on 2,048 fresh candidates (features extracted) and on the same
candidates again (features cached), next to TVM's feature extractor alone and MetaSchedule's own
XGBModel.predict on the same programs.

    for op in matmul-512 conv2d-resnet50-c2 dense-bert dwconv-mobilenetv2 batch-matmul-bert; do
        tunecore run --model op:$op --search random --trials 160 --seed 0 --store sqlite:data.db; done
    python bench/xgb_objectives.py --store data.db [--out bench/results]
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from tunecore import experiments
from tunecore.experiments import write_results

TOP_K = (1, 8, 32)


def peak_score(latencies: np.ndarray, scores: np.ndarray, k: int) -> float:
    ok = np.isfinite(latencies)
    top = np.argsort(-scores)[:k]
    chosen = latencies[top][np.isfinite(latencies[top])]
    return float(latencies[ok].min() / chosen.min()) if len(chosen) else 0.0


def spearman(latencies: np.ndarray, scores: np.ndarray) -> float:
    from scipy.stats import spearmanr

    ok = np.isfinite(latencies)
    return float(spearmanr(-latencies[ok], scores[ok]).statistic) if ok.sum() > 2 else float("nan")


def evaluate(model_factory, train: list, test: list) -> dict:
    model = model_factory()
    by_task: dict = {}
    for task, candidate, result in train:
        by_task.setdefault(task.task_id, (task, [], []))
        by_task[task.task_id][1].append(candidate)
        by_task[task.task_id][2].append(result)
    started = time.perf_counter()
    for task, candidates, results in by_task.values():
        model.update(task, candidates, results)
    train_s = time.perf_counter() - started
    tests: dict = {}
    for task, candidate, result in test:
        tests.setdefault(task.task_id, (task, [], []))
        tests[task.task_id][1].append(candidate)
        tests[task.task_id][2].append(result.latency if result.latency is not None else np.inf)
    out = {f"peak@{k}": [] for k in TOP_K}
    out["spearman"] = []
    for task, candidates, latencies in tests.values():
        scores = np.asarray(model.predict(task, candidates))
        lat = np.asarray(latencies)
        for k in TOP_K:
            out[f"peak@{k}"].append(peak_score(lat, scores, k))
        out["spearman"].append(spearman(lat, scores))
    return {**{k: float(np.nanmean(v)) for k, v in out.items()}, "train_s": train_s}


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--store", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from tunecore.store.sqlite import SqliteStore
    from tunecore_ansor_search.xgb import XGBModel

    store = SqliteStore(args.store)
    data = []
    tasks = store.get_tasks()
    for task in tasks:
        for record in store.records(task.task_id):
            data.append((task, record.candidate(task), record.result()))
    print(f"{len(data)} records of {len(tasks)} tasks", file=sys.stderr)
    rng = np.random.default_rng(args.seed)
    report: dict = {"store": os.path.basename(args.store), "records": len(data),
                    "tasks": {t.name: len(store.records(t.task_id)) for t in tasks}, "objectives": {}}
    for objective in ("pack-sum", "rank"):
        def factory(objective=objective):
            return XGBModel(objective=objective, seed=args.seed)

        halves = rng.random(len(data)) < 0.5
        within = evaluate(factory, [d for d, h in zip(data, halves) if h], [d for d, h in zip(data, halves) if not h])
        cross = {}
        for left_out in tasks:
            result = evaluate(factory, [d for d in data if d[0].task_id != left_out.task_id],
                              [d for d in data if d[0].task_id == left_out.task_id])
            cross[left_out.name] = result
        cross_mean = {k: float(np.mean([r[k] for r in cross.values()])) for k in next(iter(cross.values()))}
        report["objectives"][objective] = {"within_task": within, "cross_task_mean": cross_mean, "cross_task": cross}
        print(objective, json.dumps({"within": within, "cross": cross_mean}), file=sys.stderr)

    # speed: 2,048 fresh candidates of the first task, then the same again (features cached)
    from tunecore.interfaces import Candidate
    from tunecore.space import DesignSpace

    task = tasks[0]
    model = XGBModel(seed=args.seed)
    model.update(task, [d[1] for d in data if d[0] is task], [d[2] for d in data if d[0] is task])
    space = DesignSpace(task, seed=args.seed)
    fresh = []
    while len(fresh) < 2048 + 16:
        sch = space.sample()
        if sch is not None:
            fresh.append(Candidate.from_schedule(task, sch))
    model.predict(task, fresh[2048:])  # one-time setup (TVM context, tensor intrinsics) outside the timing
    fresh = fresh[:2048]
    started = time.perf_counter()
    model.predict(task, fresh)
    cold = time.perf_counter() - started
    started = time.perf_counter()
    model.predict(task, fresh)
    cached = time.perf_counter() - started
    measured = [(d[1], d[2]) for d in data if d[0] is task]
    report["predict_2048"] = {"task": task.name, "cold_s": cold, "cached_s": cached, "threads": model.threads,
                              **metaschedule_predict_seconds(task, measured, fresh, model.threads)}
    print(f"predict 2048 {task.name}: {json.dumps(report['predict_2048'])}", file=sys.stderr)

    write_results(args.out, "xgb_objectives", report, markdown(report))


def metaschedule_predict_seconds(task, measured: list, fresh: list, threads: int) -> dict:
    """MetaSchedule's own XGBModel on the same task and programs: where the cold time goes.

    Both models call TVM's PerStoreFeature extractor, which lowers every program (a dozen TIR passes,
    Simplify among them) before counting; timed here alone, and inside MetaSchedule's predict.
    """
    import tvm
    from tvm.s_tir import meta_schedule as ms

    context = ms.TuneContext(mod=task.mod, target=task.target, num_threads=threads)
    args = [ms.arg_info.ArgInfo.from_json(a) for a in task.args]
    ok = [(c, r) for c, r in measured if r.latency is not None]
    model = ms.cost_model.XGBModel(num_warmup_samples=0)
    model.update(context, [ms.MeasureCandidate(c.sch, args) for c, _ in ok],
                 [ms.runner.RunnerResult([tvm.tirx.FloatImm("float64", s) for s in r.run_secs], None) for _, r in ok])
    candidates = [ms.MeasureCandidate(c.sch, args) for c in fresh]
    started = time.perf_counter()
    ms.feature_extractor.PerStoreFeature(extract_workload=False).extract_from(context, candidates)
    extract = time.perf_counter() - started
    started = time.perf_counter()
    model.predict(context, candidates)
    return {"extract_only_s": extract, "metaschedule_cold_s": time.perf_counter() - started}


def markdown(report: dict) -> str:
    lines = [f"# xgb cost model: pack-sum vs rank ({report['records']} records: "
             + ", ".join(f"{k} {v}" for k, v in report["tasks"].items()) + ")", "",
             "| objective | split | peak@1 | peak@8 | peak@32 | Spearman | train s |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for objective, r in report["objectives"].items():
        for split, m in (("within task", r["within_task"]), ("unseen task (mean)", r["cross_task_mean"])):
            lines.append(f"| {objective} | {split} | {m['peak@1']:.3f} | {m['peak@8']:.3f} | {m['peak@32']:.3f} | "
                         f"{m['spearman']:.3f} | {m['train_s']:.2f} |")
    p = report["predict_2048"]
    lines += ["", f"predict on 2,048 new candidates of {p['task']} ({p['threads']} threads): {p['cold_s']:.2f} s with "
              f"feature extraction, {p['cached_s']:.3f} s with features cached."]
    if "extract_only_s" in p:
        lines += ["", f"TVM's PerStoreFeature extraction alone on the same 2,048 programs: {p['extract_only_s']:.2f} "
                      f"s; MetaSchedule's own XGBModel.predict on them: {p['metaschedule_cold_s']:.2f} s."]
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
