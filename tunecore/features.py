"""What learned cost models describe programs and devices with, in one place.

MetaSchedule's per-store features of candidates (Ansor's 164 numbers per buffer store), cached by program,
shared by the cost models that learn from them (``xgb``, ``cdmpp``, ``ncu``): TVM's parallel C++ extractor,
one TuneContext per task, a bounded cache keyed by the candidate's program key, and a program TVM cannot
extract features from gives None instead of failing its batch. Within ``shared_features()`` every extractor
answers from one cache (models judged side by side on the same programs extract each program once). Also a
program's fixed-length summary of its store rows, and a device's description as numbers.
"""

from __future__ import annotations

import collections
import contextlib
import math
from typing import Any, Sequence

import numpy as np

from tunecore.data import Candidate, Task

N_FEATURES = 164
N_DEVICE_FEATURES = 12


class PerStoreFeatures:
    def __init__(self, threads: int, cache_size: int = 50_000):
        self.threads = threads
        self.cache_size = cache_size
        self.cache: collections.OrderedDict[str, np.ndarray | None] = collections.OrderedDict()
        self.contexts: dict[str, Any] = {}

    def __call__(self, task: Task, candidates: Sequence[Candidate]) -> list[np.ndarray | None]:
        """Per-store feature rows (n_stores x 164, float32) of each candidate; None where TVM cannot extract them."""
        if _shared is not None and _shared is not self:
            return _shared(task, candidates)
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


_shared: PerStoreFeatures | None = None


@contextlib.contextmanager
def shared_features(programs: int) -> Any:
    """Every ``PerStoreFeatures`` answers from one cache of at least ``programs`` programs until the block ends.
    A program's features are the same whichever model asks for them, so sharing changes no model's numbers, only
    the time they take."""
    global _shared
    from tunecore.targets import model_threads

    outer = _shared
    if outer is None:
        _shared = PerStoreFeatures(model_threads(), max(programs, 1))
    else:
        outer.cache_size = max(outer.cache_size, programs)
    try:
        yield _shared
    finally:
        _shared = outer


def program_row(rows: np.ndarray) -> np.ndarray:
    """One fixed-length row per program from its per-store rows: their sum and their maximum (2 x 164)."""
    return np.concatenate([rows.sum(axis=0), rows.max(axis=0)])


def device_features(device: dict[str, Any] | None) -> np.ndarray:
    """The device as ``N_DEVICE_FEATURES`` numbers, for cost models that learn across devices (``cdmpp``, ``ncu``):
    kind, clock, cores, vector width, FMA, caches, peak FLOP/s; SMs and memory on GPUs. ValueError naming what is
    missing."""
    if not device:
        raise ValueError("no device description")
    kind = device.get("kind")
    need = {"llvm": ("cores", "vector_bits", "clock_mhz"), "cuda": ("sm_count", "clock_mhz")}.get(kind)
    if need is None:
        raise ValueError(f"no device features for target kind {kind!r} (there are device features for llvm and cuda)")
    missing = [k for k in need if not device.get(k)]
    if missing:
        raise ValueError(f"device {device.get('cpu') or device.get('gpu') or kind} lacks {', '.join(missing)}")

    def log2(value: float | None, scale: float) -> float:
        return math.log2(1 + value) / scale if value else 0.0

    clock_ghz = device["clock_mhz"] / 1000
    if kind == "llvm":
        lanes = device["vector_bits"] / 32
        fma = bool(device.get("fma"))
        # two vector pipes per core on every x86 core of the last decade
        peak_gflops = device["cores"] * clock_ghz * lanes * (2 if fma else 1) * 2
        return np.array([
            1.0, 0.0, clock_ghz / 4, log2(device["cores"], 8), device["vector_bits"] / 512, float(fma),
            log2(device.get("l1_bytes"), 24), log2(device.get("l2_bytes"), 32),
            log2(device.get("l3_bytes"), 32), log2(peak_gflops, 16), 0.0, 0.0,
        ], dtype=np.float32)
    peak_gflops = device["sm_count"] * 128 * 2 * clock_ghz
    return np.array([
        1.0, 1.0, clock_ghz / 4, 0.0, 0.0, 1.0, 0.0, log2(device.get("l2_bytes"), 32), 0.0, log2(peak_gflops, 16),
        log2(device["sm_count"], 8), log2(device.get("memory_bytes"), 40),
    ], dtype=np.float32)
