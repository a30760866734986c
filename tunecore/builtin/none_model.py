"""The ``none`` cost model: predicts nothing, so a search that consults it runs unguided."""

from __future__ import annotations

import numpy as np

from tunecore.roles import CostModel


class NoneModel(CostModel):
    name = "none"
    learns = False

    def update(self, task, candidates, results) -> None:
        pass

    def predict(self, task, candidates) -> np.ndarray:
        return np.zeros(len(candidates))

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            f.write('{"cost_model": "none"}\n')

    def load(self, path: str) -> None:
        pass
