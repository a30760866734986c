"""The `ncu` cost model: latency from hardware-profile metrics, in two stages.

The study this follows (summerspringwei/tvm_oraa) ranked candidates by their *measured* Nsight Compute
metrics: an oracle, since a search scores thousands of candidates it cannot profile. Here:

- **stage A** predicts each profile metric of a program, as log(count per FLOP), from its static features
  (MetaSchedule's per-store features, summed and maxed over stores, and log FLOPs): one XGBoost regressor per
  metric, trained on every profiled program of every task (counts are deterministic, so they transfer better
  than latencies);
- **stage B** predicts log latency from stage A's predictions (per FLOP and absolute), roofline terms and
  the device's attributes. It is trained on stage A's *out-of-fold* predictions (folds by task), so it learns
  how far it can trust them on programs stage A has not seen, which is all it will be asked about.

``objective=rank`` trains stage B to order the programs of each task on a device (XGBoost's pairwise ranking,
one group per task and device) instead of to predict their log latency: a search only needs the order within a
task, and a regression spends its capacity on each task's level. The model then ranks but predicts no seconds.

Metrics that measure or divide by time (durations, rates, cycles, %-of-peak) are never features: they would
leak the label. Until ``min_profiles`` programs carry profiles, stage B learns from the static features alone.

With ``oracle=DATASET`` the model is the study's oracle, for the yardstick only: stage B learns from and
predicts with the measured metrics that the dataset file holds for the very programs it ranks (a program
without them ranks last). ``static=true`` gives stage B the static features as well.

During a run, the profiler of the target (``cpu``: callgrind + llvm-mca; ``cuda``: ncu) profiles a sample of
the measured candidates (see tunecore_ncu_costmodel.profilers), and every ``update`` retrains both stages.
"""

from __future__ import annotations

import json
import math
from typing import Any, Sequence

import numpy as np

from tunecore.interfaces import (
    N_DEVICE_FEATURES,
    Candidate,
    CostModel,
    MeasureResult,
    PerStoreFeatures,
    Task,
    check_options,
    device_features,
    is_int,
    is_number,
    load_model_json,
    program_row,
    save_model_json,
)
from tunecore_ncu_costmodel import cpu, ncu_csv

_UNKNOWN_SECS = 1e9  # the prediction for a program the model cannot describe: last, and still a finite score
_NOT_FEATURES = set(cpu.BOOKKEEPING) | {"cpu.failed", "ncu.kernels"}


def is_feature_metric(name: str) -> bool:
    """A profile entry the model may learn from: a count or a static estimate, not a time, not bookkeeping."""
    if name in _NOT_FEATURES or name.endswith(".failed"):
        return False
    if name.startswith("ncu."):
        return not ncu_csv.is_time_derived(name[len("ncu."):])
    return name.startswith(("cpu.", "mca."))


def feature_metrics(profile: dict[str, float] | None) -> dict[str, float] | None:
    """The entries of a profile the model learns from; None for no profile or a failed one."""
    if not profile or any(k.endswith(".failed") for k in profile):
        return None
    return {k: v for k, v in profile.items() if is_feature_metric(k)} or None


def device_row(device: dict[str, Any] | None) -> np.ndarray:
    """The device's attributes (tunecore.features.device_features); zeros for a device it cannot describe."""
    try:
        return device_features(device)
    except ValueError:
        return np.zeros(N_DEVICE_FEATURES, dtype=np.float32)


class NcuModel(CostModel):
    name = "ncu"
    predicts_latency = True

    def __init__(self, *, rounds: int = 150, stage_a_rounds: int = 60, max_depth: int = 6, eta: float = 0.1,
                 folds: int = 4, min_profiles: int = 16, min_data: int = 16, static: bool = False,
                 oracle: str | None = None, objective: str = "latency", threads: int | None = None,
                 **kwargs: Any):
        super().__init__(**kwargs)
        check_options(
            rounds=(rounds, is_int(rounds, 1), "an integer >= 1"),
            stage_a_rounds=(stage_a_rounds, is_int(stage_a_rounds, 1), "an integer >= 1"),
            max_depth=(max_depth, is_int(max_depth, 1), "an integer >= 1"),
            eta=(eta, is_number(eta, 1e-9), "a positive number"),
            folds=(folds, is_int(folds, 2), "an integer >= 2"),
            min_profiles=(min_profiles, is_int(min_profiles, 1), "an integer >= 1"),
            min_data=(min_data, is_int(min_data, 1), "an integer >= 1"),
            static=(static, isinstance(static, bool), "true or false"),
            oracle=(oracle, oracle is None or isinstance(oracle, str), "a dataset file"),
            objective=(objective, objective in ("latency", "rank"), "latency or rank"),
            threads=(threads, threads is None or is_int(threads, 1), "an integer >= 1"),
        )
        from tunecore.targets import model_threads

        self.threads = threads or model_threads()
        self.stage_a_rounds = stage_a_rounds
        self.rounds, self.folds, self.min_profiles, self.min_data = rounds, folds, min_profiles, min_data
        self.static, self.objective = static, objective
        self.predicts_latency = objective == "latency"  # a ranker's outputs are no seconds
        # 64 histogram bins, not 256: 5x faster on a few hundred programs (stage A refits as profiles arrive)
        self.params = {"max_depth": max_depth, "eta": eta, "subsample": 0.9, "max_bin": 64, "nthread": self.threads,
                       "seed": self.seed, "verbosity": 0, "objective": "reg:squarederror"}
        self.extractor = PerStoreFeatures(self.threads)
        self.oracle = _oracle_metrics(oracle) if oracle else None
        self.rng = np.random.default_rng(self.seed)
        self.reset()

    def profilers(self, target: Any) -> list[str]:
        return {"llvm": ["cpu"], "cuda": ["ncu"]}.get(target.kind.name, [])

    def reset(self) -> None:
        # per program: static row, log flops, device row, latency (None: failed), feature metrics (None: unprofiled)
        self.programs: dict[tuple[str, str], tuple[np.ndarray, float, np.ndarray, float | None, dict | None]] = {}
        self.metric_names: list[str] = []
        self.stage_a: dict[str, Any] = {}
        self._stage_a_fitted_on: Any = None
        self._out_of_fold: dict[tuple[str, str], np.ndarray] = {}
        self.stage_b: Any = None
        self.stage_b_metrics = False  # whether stage B was trained on metrics (else on static features alone)

    # features

    def _static(self, task: Task, candidates: Sequence[Candidate]) -> list[np.ndarray | None]:
        rows = self.extractor(task, candidates)
        return [program_row(r) if r is not None and len(r) else None for r in rows]

    def _metrics_of(self, task: Task, candidate: Candidate, profile: dict[str, float] | None) -> dict | None:
        if self.oracle is not None:
            return self.oracle.get((task.workload_hash, candidate.key))
        return feature_metrics(profile)

    # learning

    def update(self, task: Task, candidates: Sequence[Candidate], results: Sequence[MeasureResult]) -> None:
        self.update_all([(task, candidates, results)])

    def update_all(self, batches: Sequence[tuple[Task, Sequence[Candidate], Sequence[MeasureResult]]]) -> None:
        for task, candidates, results in batches:
            log_flops = math.log(max(task.flops, 1.0))
            for c, static, r in zip(candidates, self._static(task, candidates), results):
                if static is None:
                    continue
                metrics = self._metrics_of(task, c, r.profile)
                known = self.programs.get((task.task_id, c.key))
                if metrics is None and known is not None:
                    metrics = known[4]  # a program measured again keeps its profile
                self.programs[(task.task_id, c.key)] = (static, log_flops, device_row(r.device or self.device),
                                                        r.latency, metrics)
        if sum(p[3] is not None for p in self.programs.values()) >= self.min_data:
            self._train()

    def _train(self) -> None:
        import xgboost as xgb

        keys = list(self.programs)
        static = np.stack([self.programs[k][0] for k in keys])
        log_flops = np.array([self.programs[k][1] for k in keys], dtype=np.float32)
        devices = np.stack([self.programs[k][2] for k in keys])
        latency = np.array([self.programs[k][3] or np.nan for k in keys])
        profiled = [i for i, k in enumerate(keys) if self.programs[k][4]]
        counts: dict[str, int] = {}
        for i in profiled:
            for name in self.programs[keys[i]][4]:
                counts[name] = counts.get(name, 0) + 1
        self.metric_names = sorted(n for n, c in counts.items() if c >= 0.5 * len(profiled))
        measured = ~np.isnan(latency)
        self.stage_b_metrics = len(profiled) >= self.min_profiles and bool(self.metric_names)
        if not self.stage_b_metrics:
            self.stage_a = {}
            inputs = self._stage_b_inputs(None, static, log_flops, devices, static_only=True)
        elif self.oracle is not None:
            metrics = self.metric_matrix([(self.programs[k][4], self.programs[k][1]) for k in keys])
            inputs = self._stage_b_inputs(metrics, static, log_flops, devices)
            measured &= ~np.isnan(metrics).all(axis=1)
        else:
            predicted = self._stage_a_predictions(keys, _stage_a_inputs(static, log_flops, devices), profiled)
            inputs = self._stage_b_inputs(predicted, static, log_flops, devices)
        if self.objective == "rank":
            groups = _groups([(k[0], devices[i].tobytes()) for i, k in enumerate(keys)])
            order = np.flatnonzero(measured)[np.argsort(groups[measured], kind="stable")]
            dtrain = xgb.DMatrix(inputs[order], label=-np.log(latency[order]), qid=groups[order])
            self.stage_b = xgb.train({**self.params, "objective": "rank:pairwise"}, dtrain,
                                     num_boost_round=self.rounds)
        else:
            dtrain = xgb.DMatrix(inputs[measured], label=np.log(latency[measured]))
            self.stage_b = xgb.train(self.params, dtrain, num_boost_round=self.rounds)

    def metric_matrix(self, entries: Sequence[tuple[dict | None, float]]) -> np.ndarray:
        """Per (metrics, log FLOPs), each metric as a feature (``_per_flop``); NaN where unknown."""
        out = np.full((len(entries), len(self.metric_names)), np.nan, dtype=np.float32)
        for i, (metrics, log_flops) in enumerate(entries):
            for j, name in enumerate(self.metric_names):
                if metrics and name in metrics:
                    out[i, j] = _per_flop(metrics[name], log_flops, name)
        return out

    def _stage_a_predictions(self, keys: list, x: np.ndarray, profiled: list[int]) -> np.ndarray:
        """Stage A's predictions for every program: out-of-fold for the profiled ones, from the full models for the
        rest. Stage A is refitted only when the profiled programs changed (in a run, most rounds profile none)."""

        fitted_on = (frozenset(keys[i] for i in profiled), tuple(self.metric_names))
        if fitted_on != self._stage_a_fitted_on:
            self._fit_stage_a([keys[i] for i in profiled], x[profiled])
            self._stage_a_fitted_on = fitted_on
        out = self._stage_a_predict(x)
        for i, key in enumerate(keys):
            if key in self._out_of_fold:
                out[i] = self._out_of_fold[key]
        return out

    def _stage_a_predict(self, x: np.ndarray) -> np.ndarray:
        """Stage A's prediction of every metric (as ``_per_flop`` features) for rows of ``_stage_a_inputs``."""
        import xgboost as xgb

        out = np.zeros((len(x), len(self.metric_names)), dtype=np.float32)
        data = xgb.DMatrix(x)
        for j, name in enumerate(self.metric_names):
            if name in self.stage_a:
                out[:, j] = self.stage_a[name].predict(data)
        return out

    def predicted_metrics(self, task: Task, candidates: Sequence[Candidate]) -> np.ndarray:
        """Stage A's prediction of every metric in ``metric_names`` (as log count per FLOP) for programs on
        ``self.device``, one row per candidate; NaN for a program without static features."""
        static_rows = self._static(task, candidates)
        valid = [i for i, r in enumerate(static_rows) if r is not None]
        out = np.full((len(candidates), len(self.metric_names)), np.nan, dtype=np.float32)
        if valid:
            static = np.stack([static_rows[i] for i in valid])
            log_flops = np.full(len(valid), math.log(max(task.flops, 1.0)), dtype=np.float32)
            devices = np.repeat(device_row(self.device)[None, :], len(valid), axis=0)
            out[valid] = self._stage_a_predict(_stage_a_inputs(static, log_flops, devices))
        return out

    def _fit_stage_a(self, keys: list, x: np.ndarray) -> None:
        """A regressor per metric on the profiled programs, and their out-of-fold predictions (folds by task,
        so that out-of-fold means "on a task stage A has not seen"; by program when there are fewer tasks)."""
        import xgboost as xgb

        targets = self.metric_matrix([(self.programs[k][4], self.programs[k][1]) for k in keys])
        task_ids = sorted({task_id for task_id, _ in keys})
        if len(task_ids) >= self.folds:
            index = {t: i for i, t in enumerate(task_ids)}
            folds = np.array([index[task_id] % self.folds for task_id, _ in keys])
        else:
            folds = np.arange(len(keys)) % self.folds
        out = np.full_like(targets, np.nan)
        self.stage_a = {}
        for j, name in enumerate(self.metric_names):
            has = ~np.isnan(targets[:, j])
            if has.sum() < 2:
                continue
            self.stage_a[name] = xgb.train(self.params, xgb.DMatrix(x[has], label=targets[has, j]),
                                           num_boost_round=self.stage_a_rounds)
            out[:, j] = self.stage_a[name].predict(xgb.DMatrix(x))
            for fold in range(self.folds):
                train, held = has & (folds != fold), folds == fold
                if held.any() and train.sum() >= 2:
                    booster = xgb.train(self.params, xgb.DMatrix(x[train], label=targets[train, j]),
                                        num_boost_round=self.stage_a_rounds)
                    out[held, j] = booster.predict(xgb.DMatrix(x[held]))
        self._out_of_fold = {key: np.nan_to_num(row) for key, row in zip(keys, out)}

    def _stage_b_inputs(self, metrics: np.ndarray | None, static: np.ndarray, log_flops: np.ndarray,
                        devices: np.ndarray, static_only: bool = False) -> np.ndarray:
        """Metrics per FLOP and absolute (log), roofline terms, device attributes (+ static features)."""
        parts = [log_flops[:, None], devices]
        if metrics is not None:
            parts += [metrics, metrics + log_flops[:, None], _roofline(metrics, self.metric_names, log_flops, devices)]
        if static_only or self.static:
            parts.append(static)
        return np.concatenate(parts, axis=1).astype(np.float32)

    # predicting

    def predict_latency(self, task: Task, candidates: Sequence[Candidate]) -> np.ndarray:
        if not self.predicts_latency:
            return super().predict_latency(task, candidates)
        if self.stage_b is None:
            return np.full(len(candidates), np.nan)
        output, known = self._stage_b_output(task, candidates)
        return np.where(known, np.exp(output), _UNKNOWN_SECS)  # a program it cannot describe: slowest

    def _stage_b_output(self, task: Task, candidates: Sequence[Candidate]) -> tuple[np.ndarray, np.ndarray]:
        """Stage B's output per candidate (log seconds, or a ranking score), and whether the model could describe
        the candidate at all (static features; for the oracle, measured metrics)."""
        import xgboost as xgb

        output, known = np.zeros(len(candidates)), np.zeros(len(candidates), dtype=bool)
        static_rows = self._static(task, candidates)
        valid = [i for i, r in enumerate(static_rows) if r is not None]
        if not valid:
            return output, known
        static = np.stack([static_rows[i] for i in valid])
        log_flops = np.full(len(valid), math.log(max(task.flops, 1.0)), dtype=np.float32)
        devices = np.repeat(device_row(self.device)[None, :], len(valid), axis=0)
        if not self.stage_b_metrics:
            inputs = self._stage_b_inputs(None, static, log_flops, devices, static_only=True)
        elif self.oracle is not None:
            metrics = self.metric_matrix([(self.oracle.get((task.workload_hash, candidates[i].key)), log_flops[0])
                                           for i in valid])
            inputs = self._stage_b_inputs(metrics, static, log_flops, devices)
        else:
            metrics = self._stage_a_predict(_stage_a_inputs(static, log_flops, devices))
            inputs = self._stage_b_inputs(metrics, static, log_flops, devices)
        output[valid] = self.stage_b.predict(xgb.DMatrix(inputs))
        known[valid] = True
        if self.oracle is not None and self.stage_b_metrics:
            known[np.array(valid)[np.isnan(metrics).all(axis=1)]] = False  # the oracle knows nothing of it
        return output, known

    def predict(self, task: Task, candidates: Sequence[Candidate]) -> np.ndarray:
        if not candidates:
            return np.zeros(0)
        if self.stage_b is None:  # nothing learned yet: a random order
            return self.rng.uniform(size=len(candidates))
        output, known = self._stage_b_output(task, candidates)
        score = output if self.objective == "rank" else -np.exp(output)  # higher = faster
        return np.where(known, score, -1e9)

    # persistence

    def save(self, path: str) -> None:
        def booster(b: Any) -> Any:
            return None if b is None else json.loads(bytes(b.save_raw("json")).decode())

        save_model_json(path, "ncu", 1, {
            "metric_names": self.metric_names, "stage_b_metrics": self.stage_b_metrics, "static": self.static,
            "objective": self.objective,
            "stage_a": {k: booster(b) for k, b in self.stage_a.items()}, "stage_b": booster(self.stage_b)})

    def load(self, path: str) -> None:
        import xgboost as xgb

        saved = load_model_json(path, "ncu", 1)

        def booster(raw: Any) -> Any:
            if raw is None:
                return None
            b = xgb.Booster()
            b.load_model(bytearray(json.dumps(raw).encode()))
            return b

        self.metric_names, self.static = saved["metric_names"], saved["static"]
        self.objective = saved.get("objective", "latency")
        self.predicts_latency = self.objective == "latency"
        self.stage_b_metrics = saved["stage_b_metrics"]
        self.stage_a = {k: booster(v) for k, v in saved["stage_a"].items()}
        self.stage_b = booster(saved["stage_b"])


def _groups(keys: Sequence[Any]) -> np.ndarray:
    """A group number per key, numbered in order of first appearance."""
    index: dict[Any, int] = {}
    return np.array([index.setdefault(k, len(index)) for k in keys], dtype=np.int64)


def _stage_a_inputs(static: np.ndarray, log_flops: np.ndarray, devices: np.ndarray) -> np.ndarray:
    """Stage A's features: the programs' static rows, log FLOPs and the device's attributes."""
    return np.concatenate([static, log_flops[:, None], devices], axis=1)


def _per_flop(value: float, log_flops: float, name: str) -> float:
    """A metric as a feature: log(count per FLOP); rates and ratios that are not counts stay log-scaled only."""
    if name.startswith("mca.") or name.startswith(("ncu.launch__", "ncu.device__")):
        return math.log1p(max(value, 0.0))
    return math.log1p(max(value, 0.0)) - log_flops


def _roofline(metrics: np.ndarray, names: list[str], log_flops: np.ndarray, devices: np.ndarray) -> np.ndarray:
    """log of the time bounds a roofline gives, in cycles of one core: compute (FLOPs at the vector units' peak:
    two FMA pipes), issue (instructions at 4 per cycle) and memory (L2 misses' lines at 16 bytes per cycle);
    and their maximum."""
    lanes = devices[:, 4] * 512 / 32  # device_features: vector bits / 512
    fma = 1 + devices[:, 5]
    compute = log_flops - np.log(np.maximum(2 * lanes * fma, 1.0))
    columns = [compute]
    for name, per_cycle in (("cpu.instructions", 4.0), ("cpu.l2_misses", 16.0 / 64.0)):
        if name in names:
            columns.append(metrics[:, names.index(name)] + log_flops - math.log(per_cycle))
    bounds = np.stack(columns, axis=1)
    return np.concatenate([bounds, bounds.max(axis=1, keepdims=True)], axis=1)


def _oracle_metrics(path: str) -> dict[tuple[str, str], dict[str, float]]:
    """(task key, program key) -> the measured feature metrics a dataset file holds."""
    from tunecore.dataset import Dataset

    out = {}
    for row in Dataset.load(path).rows:
        metrics = feature_metrics(row.profile)
        if metrics:
            out[row.task_key, row.program_key] = metrics
    return out
