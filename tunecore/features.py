"""MetaSchedule's per-store features of candidates (Ansor's 164 numbers per buffer store), cached by program.

Shared by the cost models that learn from them (``xgb`` in ansor_search, ``cdmpp`` in cdmpp_predictor):
TVM's parallel C++ extractor, one TuneContext per task, a bounded cache keyed by the candidate's
program key, and a program TVM cannot extract features from gives None instead of failing its batch.
"""

from __future__ import annotations

import collections
from typing import Any, Sequence

import numpy as np

from tunecore.data import Candidate, Task

N_FEATURES = 164


class PerStoreFeatures:
    def __init__(self, threads: int, cache_size: int = 50_000):
        self.threads = threads
        self.cache_size = cache_size
        self.cache: collections.OrderedDict[str, np.ndarray | None] = collections.OrderedDict()
        self.contexts: dict[str, Any] = {}

    def __call__(self, task: Task, candidates: Sequence[Candidate]) -> list[np.ndarray | None]:
        """Per-store feature rows (n_stores x 164, float32) of each candidate; None where TVM cannot extract them."""
        missing = {}
        for c in candidates:
            if c.key not in self.cache and c.key not in missing:
                missing[c.key] = c
        if missing:
            for key, rows in zip(missing, self._extract(task, list(missing.values()))):
                self.cache[key] = rows
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
        return [self.cache.get(c.key) for c in candidates]

    def _extract(self, task: Task, candidates: list[Candidate]) -> list[np.ndarray | None]:
        from tvm.s_tir import meta_schedule as ms

        context = self.context(task)
        args = [ms.arg_info.ArgInfo.from_json(a) for a in task.args]
        extractor = ms.feature_extractor.PerStoreFeature(extract_workload=False)

        def extract(batch: list[Candidate]) -> list[np.ndarray]:
            measure = [ms.MeasureCandidate(c.sch, args) for c in batch]
            return [f.numpy().astype(np.float32) for f in extractor.extract_from(context, measure)]

        try:
            return list(extract(candidates))
        except Exception:  # one bad program fails the batch: find it, keep the rest
            out: list[np.ndarray | None] = []
            for c in candidates:
                try:
                    out.append(extract([c])[0])
                except Exception:
                    out.append(None)
            return out

    def context(self, task: Task) -> Any:
        """The task's TuneContext (made once per task)."""
        context = self.contexts.get(task.task_id)
        if context is None:
            from tvm.s_tir import meta_schedule as ms

            from tunecore.targets import load_tensor_intrinsics

            load_tensor_intrinsics(task.target)
            context = ms.TuneContext(mod=task.mod, target=task.target, num_threads=self.threads)
            self.contexts[task.task_id] = context
        return context


def program_row(rows: np.ndarray) -> np.ndarray:
    """One fixed-length row per program from its per-store rows: their sum and their maximum (2 x 164)."""
    return np.concatenate([rows.sum(axis=0), rows.max(axis=0)])
