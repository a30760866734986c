"""The ``none`` cost model: predicts nothing, so a search that consults it runs unguided."""

from __future__ import annotations

import numpy as np

from tunecore.modelfile import load_model_json, save_model_json
from tunecore.roles import CostModel


class NoneModel(CostModel):
    name = "none"
    learns = False

    def update(self, task, candidates, results) -> None:
        pass

    def predict(self, task, candidates) -> np.ndarray:
        return np.zeros(len(candidates))

    def save(self, path: str) -> None:
        save_model_json(path, "none", 1, {})

    def load(self, path: str) -> None:
        load_model_json(path, "none", 1)  # nothing to read, but a file of another model is still a mistake
