"""The `cdmpp` cost model: predicted seconds of a program on a device, for any search policy.

Starts from the weights shipped with the plugin (trained on tunecore's dataset, every device in it)
unless told otherwise (``-O cdmpp.weights=none`` or a path), and keeps learning during a run: each
measured round fine-tunes the adapter of the run's device for ``online_steps`` minibatches, half of
them from that round (``-O cdmpp.online=false`` turns it off): the shared network, and what it
predicts for other devices, stays as it was. Given a dataset (``update_all``), an untrained model
trains the shared network from scratch for ``epochs`` passes; a trained one fine-tunes the adapters
of the devices the data was measured on. ``ensemble`` K > 1: a model trained from scratch is K networks
(model.Predictor), K times the training, whose predictions are averaged; weights from a file bring their own.
"""

from __future__ import annotations

import collections
import copy
import json
import math
import os
from typing import Any, Callable, Sequence

import numpy as np

from tunecore.interfaces import (
    Candidate,
    CostModel,
    MeasureResult,
    Progress,
    Task,
    UsageError,
    check_options,
    device_features,
    is_int,
    is_number,
)
from tunecore_cdmpp_predictor.features import CompactAST, CompactASTs

_MIN_STEPS = 200
# passes over new data when a trained model learns from it; ``epochs`` is for training from scratch, whose default
# rose from 30 to 150 with bench/results/cdmpp_data.md, which measured training from scratch only
_FINETUNE_EPOCHS = 30
SHIPPED_WEIGHTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights", "cdmpp-cpu.pt")


class CDMPPModel(CostModel):
    name = "cdmpp"
    predicts_latency = True
    target_kinds = frozenset({"llvm", "cuda"})

    def __init__(self, *, weights: str = "shipped", online: bool = True, epochs: int = 150, online_steps: int = 50,
                 batch_size: int = 256, lr: float = 1e-3, rank_weight: float | None = None, ensemble: int = 1,
                 threads: int | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        from tunecore_cdmpp_predictor.model import MAX_MEMBERS

        check_options(
            weights=(weights, isinstance(weights, str) and bool(weights), "'shipped', 'none' or a file"),
            online=(online, isinstance(online, bool), "true or false"),
            epochs=(epochs, is_int(epochs, 1), "an integer >= 1"),
            online_steps=(online_steps, is_int(online_steps, 0), "an integer >= 0"),
            batch_size=(batch_size, is_int(batch_size, 1), "an integer >= 1"),
            lr=(lr, is_number(lr, 1e-9), "a positive number"),
            rank_weight=(rank_weight, rank_weight is None or is_number(rank_weight, 0, 100),
                         "a number between 0 and 100"),
            ensemble=(ensemble, is_int(ensemble, 1) and ensemble <= MAX_MEMBERS, f"an integer from 1 to {MAX_MEMBERS}"),
            threads=(threads, threads is None or is_int(threads, 1), "an integer >= 1"),
        )
        from tunecore.targets import model_threads

        self.weights, self.online = weights, online
        self.epochs, self.online_steps, self.batch_size, self.lr = epochs, online_steps, batch_size, lr
        self.ensemble = ensemble
        self._member: int | None = None  # a view of one member of an ensemble (``members``)
        self.threads = threads or model_threads()
        self.asts = CompactASTs(self.threads)
        self.predictor = self._initial_predictor()
        self.rank_weight_option = rank_weight
        # what it learned from: (task id, program key, device id) -> (program, device features, seconds)
        self.pool: dict[tuple[str, str, str], tuple[CompactAST, np.ndarray, float]] = {}
        self._device_vectors: dict[str, np.ndarray | None] = {}
        self._checkpoint: tuple[str, dict[str, Any]] | None = None  # keep_checkpoint's
        self.rng = np.random.default_rng(self.seed)
        self.own_devices: set[str] = set()  # devices whose data trained the shared network in this process

    def _initial_predictor(self) -> Any:
        import torch

        from tunecore_cdmpp_predictor.model import Predictor

        torch.set_num_threads(self.threads)
        path = SHIPPED_WEIGHTS if self.weights == "shipped" else None if self.weights == "none" else self.weights
        if path is None or (self.weights == "shipped" and not os.path.exists(path)):
            return Predictor(seed=self.seed, members=self.ensemble)
        try:
            return Predictor.load(path)
        except (ValueError, UsageError) as error:
            raise UsageError(f"cost model 'cdmpp': {error}") from None

    def device_note(self, device: dict[str, Any]) -> str | None:
        from tunecore.targets import device_id

        trained_on = self.predictor.trained_on
        known = {*trained_on.get("devices", {}), *trained_on.get("adapted", {}), *self.predictor.adapters,
                 *self.own_devices, *(key[2] for key in self.pool)}
        if not self.predictor.trained or device_id(device) in known:
            return None
        return ("cdmpp never learned from this device: on a CPU it has not seen, its predictions can be several "
                "times off; measure a few of its programs and fine-tune for it first: `tunecore cdmpp adapt "
                "--target TARGET --dataset DATASET -o adapted.pt`, then -O cdmpp.weights=adapted.pt")

    # the device asked about

    @property
    def device(self) -> dict[str, Any] | None:
        return self._device

    @device.setter
    def device(self, description: dict[str, Any] | None) -> None:
        if description is not None:
            try:
                device_features(description)
            except ValueError as error:
                raise UsageError(f"cost model 'cdmpp': {error}") from None
        self._device = description

    def _device_vector(self, description: dict[str, Any] | None) -> np.ndarray | None:
        key = json.dumps(description, sort_keys=True)
        if key not in self._device_vectors:
            try:
                self._device_vectors[key] = device_features(description)
            except ValueError:  # measurements on a device it cannot describe are left out
                self._device_vectors[key] = None
        return self._device_vectors[key]

    # learning

    def reset(self) -> None:
        from tunecore_cdmpp_predictor.model import Predictor

        self.predictor = Predictor(seed=self.seed, members=self.ensemble)
        self.pool.clear()
        self.own_devices = set()

    @property
    def rank_weight(self) -> float:
        """The within-task ranking term of the loss (model.rank_loss): by default, what the weights were trained
        with."""
        if self.rank_weight_option is not None:
            return self.rank_weight_option
        return float(self.predictor.trained_on.get("rank_weight") or 0.0)

    def _add(self, task: Task, candidates: Sequence[Candidate], results: Sequence[MeasureResult]) -> list:
        from tunecore.targets import device_id

        ok = [(c, r) for c, r in zip(candidates, results) if r.latency is not None]
        added = []
        for (c, r), ast in zip(ok, self.asts(task, [c for c, _ in ok])):
            device = r.device or self.device or _host_device(task)
            vector = self._device_vector(device)
            if ast is None or vector is None:
                continue
            key = (task.task_id, c.key, device_id(device))
            self.pool[key] = (ast, vector, float(r.latency))
            added.append(key)
        return added

    def update(self, task: Task, candidates: Sequence[Candidate], results: Sequence[MeasureResult]) -> None:
        if not self.online:
            return
        added = self._add(task, candidates, results)
        if added and self.online_steps:
            self._learn(added, self.online_steps if self.predictor.trained else None)

    def update_all(self, batches: Sequence[tuple[Task, Sequence[Candidate], Sequence[MeasureResult]]]) -> None:
        self.learn(batches)

    def learn(self, batches: Sequence[tuple[Task, Sequence[Candidate], Sequence[MeasureResult]]],
              steps: int | None = None, on_progress: Callable[[Progress], None] | None = None) -> dict[str, Any]:
        """``update_all`` with a say in the number of steps, reporting each step to ``on_progress`` (stage
        "training"); returns what it learned from (programs, per device), what it trained, and the last loss.
        Training from scratch keeps its state where ``keep_checkpoint`` said (model.Predictor.fit)."""
        added = [key for task, candidates, results in batches for key in self._add(task, candidates, results)]
        mode = "adapters" if self.predictor.trained else "shared network"
        loss = math.nan
        if added:
            loss = self._learn(added, steps, on_progress)
        return {"programs": len(added), "devices": dict(collections.Counter(key[2] for key in added)),
                "trained": mode, "loss": loss}

    def keep_checkpoint(self, path: str, settings: dict[str, Any]) -> None:
        self._checkpoint = (path, settings)

    def _learn(self, added: Sequence[tuple], steps: int | None, on_progress: Any = None) -> float:
        """Untrained, the model trains its shared network on everything. Trained, new data on a device
        whose data this model trained the shared network on (a run or a dataset it learned from scratch)
        trains the shared network further; new data on any other device (weights from a file, a device
        never seen) fine-tunes that device's adapter only. Half of every fine-tuning batch is new data.
        ``steps`` None: ``epochs`` passes over what it learns from (from scratch), _FINETUNE_EPOCHS over the new
        data (trained)."""
        if not self.predictor.trained:
            self.own_devices = {key[2] for key in self.pool}
            # a first round of a few dozen programs still needs a few hundred steps to learn anything
            steps = steps or max(_MIN_STEPS, self.epochs * math.ceil(len(self.pool) / self.batch_size))
            return self._fit(list(self.pool), steps, None, (), on_progress, self._checkpoint)
        steps = steps or max(self.online_steps, _FINETUNE_EPOCHS * math.ceil(len(added) / self.batch_size))
        loss = math.nan
        new_devices = {key[2] for key in added}
        if new_devices & self.own_devices:
            keys = [k for k in self.pool if k[2] in self.own_devices]
            loss = self._fit(keys, steps, None, [k for k in added if k[2] in self.own_devices], on_progress)
        for device in sorted(new_devices - self.own_devices):
            keys = [k for k in self.pool if k[2] == device]
            loss = self._fit(keys, steps, device, [k for k in added if k[2] == device], on_progress)
        return loss

    def _fit(self, keys: list, steps: int, adapter: str | None, emphasis: Sequence[tuple], on_progress: Any,
             checkpoint: tuple[str, dict[str, Any]] | None = None) -> float:
        programs = [self.pool[k][0] for k in keys]
        devices = np.stack([self.pool[k][1] for k in keys])
        latencies = np.array([self.pool[k][2] for k in keys])
        weights = None
        if emphasis and len(emphasis) < len(keys):
            chosen = set(emphasis)
            new = np.array([k in chosen for k in keys])
            weights = np.where(new, 1.0 / new.sum(), 1.0 / (~new).sum())
        groups = np.array([f"{k[0]}|{k[2]}" for k in keys])  # a task on a device
        return self.predictor.fit(programs, devices, latencies, steps=steps, adapter=adapter,
                                  batch_size=self.batch_size, lr=self.lr, sample_weights=weights,
                                  rank_weight=self.rank_weight, groups=groups,
                                  seed=int(self.rng.integers(2**31)),
                                  checkpoint=checkpoint[0] if checkpoint else None,
                                  settings=checkpoint[1] if checkpoint else None,
                                  on_step=None if on_progress is None else lambda i, loss: on_progress(
                                      Progress("training", i + 1, steps * len(self.predictor.nets), loss=loss)))

    # predicting

    def predict(self, task: Task, candidates: Sequence[Candidate]) -> np.ndarray:
        if not candidates:
            return np.zeros(0)
        if not self.predictor.trained:  # nothing learned yet: a random order, like an untrained xgb
            return self.rng.uniform(size=len(candidates))
        seconds = self.predict_latency(task, candidates)
        return np.where(np.isfinite(seconds), -np.log(np.where(np.isfinite(seconds), seconds, 1.0)), -1e9)

    def predict_latency(self, task: Task, candidates: Sequence[Candidate]) -> np.ndarray:
        if not self.predictor.trained:
            raise UsageError("cost model 'cdmpp' has no weights and has not been trained")
        from tunecore.targets import device_id

        device = self.device or _host_device(task)
        vector = self._device_vector(device)
        if vector is None:
            raise UsageError(f"cost model 'cdmpp': no device features for {device}")
        asts = self.asts(task, candidates)
        adapter = device_id(device)
        have = [i for i, a in enumerate(asts) if a is not None]
        out = np.full(len(candidates), np.nan)
        if have:
            programs = [asts[i] for i in have]
            out[have] = self.predictor.predict(programs, np.repeat(vector[None, :], len(programs), axis=0), adapter,
                                               member=self._member)
        return out

    def members(self) -> list[CDMPPModel]:
        """An ensemble's members, each predicting alone (views: they share what the ensemble learned)."""
        if len(self.predictor.nets) == 1:
            return []
        views = []
        for member in range(len(self.predictor.nets)):
            view = copy.copy(self)
            view._member = member
            views.append(view)
        return views

    # the file

    def save(self, path: str) -> None:
        self.predictor.save(path)
        if self._checkpoint and os.path.exists(self._checkpoint[0]):  # the training it kept is over
            os.remove(self._checkpoint[0])

    def load(self, path: str) -> None:
        from tunecore_cdmpp_predictor.model import Predictor

        self.predictor = Predictor.load(path)


def _host_device(task: Task) -> dict[str, Any]:
    """The device a task's target runs on here: what the local measurer reports, when nobody said."""
    from tunecore.targets import device_descriptor

    return device_descriptor(task.target)
