"""The `xgb` cost model: XGBoost over MetaSchedule's per-store features (Ansor's cost model).

A candidate is described by one 164-number row per buffer store of its lowered program. Its
label is its normalized throughput within its task (best latency of the task / its latency, so
1.0 is the best seen and failures are 0). Two objectives:

- ``pack-sum`` (Ansor): the model scores each store; a candidate's score is the sum over its stores,
  trained with a custom squared-error objective on those sums, weighted towards fast candidates.
- ``rank``: one row per candidate (sum and max of its store rows), XGBoost's pairwise ranking
  objective within each task.

One model serves every task of a run (features are program-level, labels are per-task), features
are cached per program, and the model is retrained on all data after every round. Saved as JSON
(XGBoost's JSON model plus metadata), never pickled.

``weights`` starts from a saved model (e.g. one ``tunecore costmodel train`` fitted to a dataset): it ranks
the first rounds, where a fresh model can only guess, and the run's own data adds trees to it rather than
replacing it.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np

from tunecore.interfaces import (
    Candidate,
    CostModel,
    MeasureResult,
    PerStoreFeatures,
    Task,
    UsageError,
    check_options,
    is_int,
    is_number,
    load_model_json,
    program_row,
    save_model_json,
)


class XGBModel(CostModel):
    name = "xgb"

    def __init__(self, *, objective: str = "pack-sum", rounds: int = 100, max_depth: int = 8, eta: float = 0.2,
                 min_data: int = 64, cache_size: int = 50_000, threads: int | None = None, weights: str = "none",
                 **kwargs: Any):
        super().__init__(**kwargs)
        check_options(
            weights=(weights, isinstance(weights, str) and bool(weights), "'none' or a file written by save"),
            objective=(objective, objective in ("pack-sum", "rank"), "'pack-sum' or 'rank'"),
            rounds=(rounds, is_int(rounds, 1), "an integer >= 1"),
            max_depth=(max_depth, is_int(max_depth, 1), "an integer >= 1"),
            eta=(eta, is_number(eta, 1e-9), "a positive number"),
            min_data=(min_data, is_int(min_data, 1), "an integer >= 1"),
            cache_size=(cache_size, is_int(cache_size, 0), "an integer >= 0"),
            threads=(threads, threads is None or is_int(threads, 1), "an integer >= 1"),
        )
        from tunecore.targets import model_threads

        self.objective = objective
        self.rounds, self.min_data = rounds, min_data
        self.threads = threads or model_threads()
        self.params = {"max_depth": max_depth, "eta": eta, "min_child_weight": 0, "gamma": 1e-3,
                       "nthread": self.threads, "seed": self.seed, "verbosity": 0}
        self.booster: Any = None
        self.base: Any = None  # the booster of ``weights``, which the run's own data boosts further
        if weights != "none":
            self.load(weights)
            self.base = self.booster
        self.extractor = PerStoreFeatures(self.threads, cache_size)
        # training data: per candidate its feature rows, task id and latency (None = failed)
        self.data: dict[tuple[str, str], tuple[np.ndarray, float | None]] = {}
        self.rng = np.random.default_rng(self.seed)

    def features(self, task: Task, candidates: Sequence[Candidate]) -> list[np.ndarray | None]:
        """Per-store feature rows of each candidate (None where TVM cannot extract them)."""
        return self.extractor(task, candidates)

    # learning

    def update(self, task: Task, candidates: Sequence[Candidate], results: Sequence[MeasureResult]) -> None:
        self.update_all([(task, candidates, results)])

    def update_all(self, batches: Sequence[tuple[Task, Sequence[Candidate], Sequence[MeasureResult]]]) -> None:
        for task, candidates, results in batches:
            for c, rows, r in zip(candidates, self.features(task, candidates), results):
                if rows is not None and len(rows):
                    self.data[(task.task_id, c.key)] = (rows, r.latency)
        if len(self.data) >= self.min_data:
            self.booster = self._train()

    def reset(self) -> None:
        self.booster = self.base = None
        self.data.clear()

    def _labels(self) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        best: dict[str, float] = {}
        for (task_id, _), (_, latency) in self.data.items():
            if latency is not None:
                best[task_id] = min(best.get(task_id, latency), latency)
        rows, labels, groups = [], [], []
        task_index = {t: i for i, t in enumerate(sorted({k[0] for k in self.data}))}
        for (task_id, _), (features, latency) in self.data.items():
            rows.append(features)
            labels.append(best[task_id] / latency if latency is not None else 0.0)
            groups.append(task_index[task_id])
        return rows, np.asarray(labels), np.asarray(groups)

    def _train(self) -> Any:
        import xgboost as xgb

        rows, labels, groups = self._labels()
        if self.objective == "rank":
            order = np.argsort(groups, kind="stable")
            x = np.stack([program_row(rows[i]) for i in order])
            dtrain = xgb.DMatrix(x, label=labels[order], qid=groups[order])
            return xgb.train({**self.params, "objective": "rank:pairwise"}, dtrain, num_boost_round=self.rounds,
                             xgb_model=self.base)
        x = np.concatenate(rows)
        pack = np.repeat(np.arange(len(rows)), [len(r) for r in rows])
        # Ansor weights the fit towards fast candidates, which are the ones the search must rank right
        weights = np.maximum(labels, 0.05)
        dtrain = xgb.DMatrix(x)

        def pack_sum_squared_error(predictions: np.ndarray, _: Any) -> tuple[np.ndarray, np.ndarray]:
            sums = np.bincount(pack, weights=predictions, minlength=len(rows))
            residual = (sums - labels) * weights
            return 2 * residual[pack], 2 * weights[pack]

        return xgb.train({**self.params, "base_score": 0.0}, dtrain, num_boost_round=self.rounds,
                         obj=pack_sum_squared_error, xgb_model=self.base)

    def predict(self, task: Task, candidates: Sequence[Candidate]) -> np.ndarray:
        if not candidates:
            return np.zeros(0)
        if self.booster is None:  # nothing learned yet: a random order, like MetaSchedule's untrained model
            return self.rng.uniform(size=len(candidates))
        import xgboost as xgb

        rows = self.features(task, candidates)
        valid = [i for i, r in enumerate(rows) if r is not None and len(r)]
        scores = np.full(len(candidates), -1e9)  # a program without features goes last
        if not valid:
            return scores
        if self.objective == "rank":
            x = np.stack([program_row(rows[i]) for i in valid])
            scores[valid] = self.booster.predict(xgb.DMatrix(x))
        else:
            x = np.concatenate([rows[i] for i in valid])
            pack = np.repeat(np.arange(len(valid)), [len(rows[i]) for i in valid])
            scores[valid] = np.bincount(pack, weights=self.booster.predict(xgb.DMatrix(x)), minlength=len(valid))
        return scores

    # persistence

    def save(self, path: str) -> None:
        booster = None if self.booster is None else json.loads(bytes(self.booster.save_raw("json")).decode())
        save_model_json(path, "xgb", 1, {"objective": self.objective, "params": self.params, "booster": booster})

    def load(self, path: str) -> None:
        import xgboost as xgb

        try:
            saved = load_model_json(path, "xgb", 1)
            objective, booster = saved["objective"], None
            if saved["booster"] is not None:
                booster = xgb.Booster()
                booster.load_model(bytearray(json.dumps(saved["booster"]).encode()))
        except UsageError as error:
            raise UsageError(f"cost model 'xgb': {error}") from None
        except (KeyError, TypeError, xgb.core.XGBoostError) as error:
            raise UsageError(f"cost model 'xgb': {path}: a damaged xgb model file ({type(error).__name__})") from None
        self.objective, self.booster = objective, booster

