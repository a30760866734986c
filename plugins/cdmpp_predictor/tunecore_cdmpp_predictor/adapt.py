"""Which tasks to measure on a new device (CDMPP's KMeans sampling for cross-device fine-tuning).

Programs are described without any device (their leaf features, min-max scaled over all programs,
as the mean and the max over their leaves); KMeans groups them into K clusters, K = the number of
tasks to measure, and for each cluster, largest first, the task whose programs lie closest to its
centre on average (and is not chosen yet) is chosen. The chosen tasks cover the kinds of programs
the dataset holds, so a few measurements on the new device teach its adapter about all of them.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tunecore_cdmpp_predictor.features import CompactAST


def program_vectors(programs: Sequence[CompactAST]) -> np.ndarray:
    rows = np.concatenate([p.features for p in programs])
    low, span = rows.min(axis=0), np.ptp(rows, axis=0)
    span[span == 0] = 1.0
    return np.stack([np.concatenate([((p.features - low) / span).mean(axis=0), ((p.features - low) / span).max(axis=0)])
                     for p in programs])


def select_tasks(programs_by_task: dict[str, Sequence[CompactAST]], k: int, seed: int = 0) -> list[str]:
    """``k`` task keys (fewer if there are fewer tasks), the most representative first."""
    from sklearn.cluster import KMeans

    keys = [key for key, programs in programs_by_task.items() if programs]
    k = min(k, len(keys))
    if k == 0:
        return []
    owner = np.concatenate([[i] * len(programs_by_task[key]) for i, key in enumerate(keys)])
    x = program_vectors([p for key in keys for p in programs_by_task[key]])
    kmeans = KMeans(n_clusters=k, n_init=4, random_state=seed).fit(x)
    sizes = np.bincount(kmeans.labels_, minlength=k)
    chosen: list[str] = []
    for cluster in np.argsort(-sizes, kind="stable"):
        distance = np.linalg.norm(x - kmeans.cluster_centers_[cluster], axis=1)
        mean = np.bincount(owner, weights=distance, minlength=len(keys)) / np.bincount(owner, minlength=len(keys))
        for i in np.argsort(mean, kind="stable"):
            if keys[i] not in chosen:
                chosen.append(keys[i])
                break
    return chosen


def first_programs_per_task(rows: list, n: int) -> list:
    """Up to ``n`` distinct programs of each task, in the rows' order."""
    seen: set[tuple[str, str]] = set()
    count: dict[str, int] = {}
    out = []
    for r in rows:
        if (r.task_key, r.program_key) not in seen and count.get(r.task_key, 0) < n:
            seen.add((r.task_key, r.program_key))
            count[r.task_key] = count.get(r.task_key, 0) + 1
            out.append(r)
    return out
