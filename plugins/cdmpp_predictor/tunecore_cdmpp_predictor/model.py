"""CDMPP's network, its input and output normalization, training, and its file.

Network (CDMPP's AttentionNetV2, made small enough to retrain on a CPU during a run, and with a padding
mask so that one model covers every leaf count): leaf features, min-max normalized, plus the sinusoidal
encoding of each leaf's tree position -> linear -> transformer encoder (padding masked) -> mean and max
over the leaves -> MLP = program embedding; device features -> MLP = device embedding; their sum ->
MLP -> one number, the Box-Cox-transformed, standardized seconds per GFLOP (see Normalizer).

Loss: ``mse_weight`` x MSE on the transformed target + MAPE on the latency in seconds (CDMPP computes
its MAPE term on the transformed value, which divides by numbers near 0; the MAPE of the seconds is
what users are told), + ``rank_weight`` x a ranking term within tasks (``rank_loss``; off by default):
MSE and MAPE can be lowered by getting each task's level right, and on dataset v1 the model sat at the
MAPE of the best constant per task, having learned nothing within one; with the term, a batch is made of
programs of a few (task, device) groups so that it holds pairs to order.

Ensemble: ``members`` networks of the same architecture, each from its own initial weights and batch order,
sharing the normalizer; a prediction is the mean of their outputs (the transformed target, so the mean is
taken on a log-like scale, not of seconds). One member is exactly the single network of the same seed.

File: one ``torch.save`` of a dict holding the ``state_dict`` and a JSON string of metadata (format,
version, architecture, members, normalizers, what it was trained on); read with
``torch.load(weights_only=True)``, which cannot run code. A file of one member holds that network's
``state_dict`` as it always did; an ensemble's keys start with the member's index.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from tunecore.interfaces import (
    N_DEVICE_FEATURES,
    N_FEATURES,
    UsageError,
    first_line,
    load_checkpoint,
    load_model_torch,
    save_checkpoint,
    save_model_torch,
)
from tunecore_cdmpp_predictor.features import CompactAST, positional_encoding

VERSION = 1
CHECKPOINT_EVERY = 250  # steps
MAX_MEMBERS = 32  # of an ensemble; a file claiming more is not one tunecore wrote


@dataclasses.dataclass
class Architecture:
    width: int = 128
    heads: int = 4
    layers: int = 2
    feedforward: int = 256
    hidden: int = 256
    dropout: float = 0.1


def _mlp(sizes: Sequence[int], last_activation: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if last_activation or i < len(sizes) - 2:
            layers += [nn.LayerNorm(b), nn.ReLU()]
    return nn.Sequential(*layers)


class Adapter(nn.Module):
    """What one device learns on top of the shared network: an offset of its embedding and its own decoder."""

    def __init__(self, decoder: nn.Module, hidden: int):
        super().__init__()
        self.offset = nn.Parameter(torch.zeros(hidden))
        self.decoder = copy.deepcopy(decoder)


class Net(nn.Module):
    def __init__(self, arch: Architecture):
        super().__init__()
        self.hidden = arch.hidden
        self.embed = nn.Linear(N_FEATURES, arch.width)
        layer = nn.TransformerEncoderLayer(arch.width, arch.heads, arch.feedforward, arch.dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, arch.layers, enable_nested_tensor=False)
        self.program = _mlp([2 * arch.width + 1, arch.hidden, arch.hidden])
        self.device = _mlp([N_DEVICE_FEATURES, arch.hidden, arch.hidden])
        self.decoder = _mlp([arch.hidden, arch.hidden, 1], last_activation=False)
        self.adapters = nn.ModuleDict()  # device id -> Adapter

    def forward(self, leaves: torch.Tensor, mask: torch.Tensor, device: torch.Tensor,
                adapter: str | None = None) -> torch.Tensor:
        """leaves (B, L, 164), mask (B, L) True where a leaf is, device (B, N_DEVICE_FEATURES) -> (B,)."""
        return self.head(self.embed_programs(leaves, mask), device, adapter)

    def embed_programs(self, leaves: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(leaves), src_key_padding_mask=~mask)
        m = mask.unsqueeze(-1)
        count = m.sum(dim=1).clamp(min=1)
        mean = (h * m).sum(dim=1) / count
        top = h.masked_fill(~m, -1e4).max(dim=1).values
        return self.program(torch.cat([mean, top, torch.log(count)], dim=1))

    def head(self, programs: torch.Tensor, device: torch.Tensor, adapter: str | None = None) -> torch.Tensor:
        if adapter is None or adapter not in self.adapters:
            return self.decoder(programs + self.device(device)).squeeze(-1)
        a = self.adapters[adapter]
        return a.decoder(programs + self.device(device) + a.offset).squeeze(-1)

    def add_adapter(self, key: str) -> None:
        if key not in self.adapters:
            self.adapters[key] = Adapter(self.decoder, self.hidden)


@dataclasses.dataclass
class Normalizer:
    """Min-max of the leaf features; Box-Cox lambda, mean and deviation of the target.

    The target is seconds per GFLOP of the task (at least 1e5 FLOPs, so that data movement without
    arithmetic still has a scale), not seconds: a program of a kernel never seen is then judged by how
    efficiently it computes, which carries across kernel sizes; cross-model MAPE on the shipped
    dataset fell from 111% to 61% with it.
    """

    low: list[float]
    high: list[float]
    boxcox_lambda: float
    mean: float
    std: float

    @classmethod
    def fit(cls, programs: Sequence[CompactAST], latencies: np.ndarray) -> Normalizer:
        from scipy import stats

        rows = np.concatenate([p.features for p in programs])
        y = latencies / _gflops(programs)
        if np.ptp(y) > 0:
            transformed, lam = stats.boxcox(y)
        else:  # one program (a first round): Box-Cox cannot be fitted, its log limit can
            transformed, lam = np.log(y), 0.0
        return cls(rows.min(axis=0).tolist(), rows.max(axis=0).tolist(), float(lam), float(transformed.mean()),
                   float(transformed.std() or 1.0))

    def target(self, programs: Sequence[CompactAST], latencies: np.ndarray) -> np.ndarray:
        from scipy import special

        y = special.boxcox(latencies / _gflops(programs), self.boxcox_lambda)
        return ((y - self.mean) / self.std).astype(np.float32)

    def seconds(self, z: torch.Tensor, gflops: torch.Tensor) -> torch.Tensor:
        """The inverse of ``target``, differentiable (``z`` kept within 8 deviations, where it cannot overflow)."""
        y = z.clamp(-8.0, 8.0) * self.std + self.mean
        if abs(self.boxcox_lambda) < 1e-6:
            return torch.exp(y) * gflops
        base = (self.boxcox_lambda * y + 1).clamp(min=1e-6)
        return base ** (1 / self.boxcox_lambda) * gflops


def _gflops(programs: Sequence[CompactAST]) -> np.ndarray:
    return np.array([max(p.flops, 1e5) * 1e-9 for p in programs])


class Batch:
    """Programs padded to the longest one in the batch."""

    def __init__(self, programs: Sequence[CompactAST], devices: np.ndarray, normalizer: Normalizer):
        longest = max(len(p.features) for p in programs)
        leaves = np.zeros((len(programs), longest, N_FEATURES), dtype=np.float32)
        mask = np.zeros((len(programs), longest), dtype=bool)
        low, span = np.asarray(normalizer.low), np.asarray(normalizer.high) - np.asarray(normalizer.low)
        span[span == 0] = 1.0
        for i, p in enumerate(programs):
            n = len(p.features)
            leaves[i, :n] = (p.features - low) / span + positional_encoding(p.positions, N_FEATURES)
            mask[i, :n] = True
        self.leaves, self.mask = torch.from_numpy(leaves), torch.from_numpy(mask)
        self.gflops = torch.from_numpy(_gflops(programs).astype(np.float32))
        self.devices = torch.from_numpy(np.asarray(devices, dtype=np.float32))


def rank_loss(z: torch.Tensor, target: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Mean logistic loss over the pairs of programs of one group (a task on a device) whose targets differ: the
    faster program (lower target) should get the lower output. Zero when the batch holds no such pair."""
    pairs = (groups[:, None] == groups[None, :]) & (target[:, None] < target[None, :] - 1e-6)
    if not bool(pairs.any()):
        return z.sum() * 0.0
    return nn.functional.softplus(z[:, None] - z[None, :])[pairs].mean()


def group_batch(members: Sequence[np.ndarray], batch_size: int, per_group: int,
                rng: np.random.Generator) -> np.ndarray:
    """Indices of about ``batch_size`` programs: up to ``per_group`` of each of ``batch_size // per_group`` groups
    (``members``: each group's indices; drawn in proportion to their sizes), more of each when there are fewer
    groups."""
    sizes = np.array([len(m) for m in members], dtype=float)
    count = min(len(members), max(1, batch_size // per_group))
    take = max(per_group, batch_size // count)
    chosen = rng.choice(len(members), size=count, replace=False, p=sizes / sizes.sum())
    return np.concatenate([rng.choice(members[g], size=min(take, len(members[g])), replace=False) for g in chosen])


class _TrainingData:
    """What every member trains on, as tensors."""

    def __init__(self, programs: Sequence[CompactAST], devices: np.ndarray, latencies: np.ndarray,
                 normalizer: Normalizer, sample_weights: np.ndarray | None, groups: np.ndarray | None):
        self.programs, self.devices, self.normalizer = programs, devices, normalizer
        self.target = torch.from_numpy(normalizer.target(programs, latencies))
        self.gflops = torch.from_numpy(_gflops(programs).astype(np.float32))
        self.seconds = torch.from_numpy(latencies.astype(np.float32))
        self.device_tensor = torch.from_numpy(np.asarray(devices, dtype=np.float32))
        self.p = None if sample_weights is None else sample_weights / sample_weights.sum()
        self.ranking_groups: list[np.ndarray] | None = None  # each group's programs (None: no ranking term)
        if groups is not None:
            inverse = np.unique(groups, return_inverse=True)[1]
            self.group_tensor = torch.from_numpy(inverse)
            self.ranking_groups = [np.flatnonzero(inverse == g) for g in range(inverse.max() + 1)]


class Predictor:
    """The network (or an ensemble of them) with its normalizer: what a weights file holds.

    ``fit`` without ``adapter`` trains the shared network on programs of any devices. ``fit`` with
    ``adapter`` (a device id) fine-tunes only that device's adapter on its measurements, the shared
    network frozen: predictions for every other device stay exactly what they were.
    """

    def __init__(self, arch: Architecture | None = None, seed: int = 0, members: int = 1):
        self.arch = arch or Architecture()
        self.nets: list[Net] = []
        for member in range(members):
            torch.manual_seed(seed + member)
            self.nets.append(Net(self.arch))
            if member == 0:
                after_first = torch.get_rng_state()
        torch.set_rng_state(after_first)  # the first member trains as the single network of this seed would
        self.normalizer: Normalizer | None = None
        self.trained_on: dict[str, Any] = {}

    @property
    def net(self) -> Net:
        """The first member (the only one, unless an ensemble)."""
        return self.nets[0]

    @property
    def adapters(self) -> list[str]:
        """The devices fine-tuned for (every member has the same adapters)."""
        return list(self.nets[0].adapters)

    @property
    def trained(self) -> bool:
        return self.normalizer is not None

    def predict(self, programs: Sequence[CompactAST], devices: np.ndarray, adapter: str | None = None,
                batch_size: int = 1024, member: int | None = None) -> np.ndarray:
        """Seconds per program: the ensemble's, or one ``member``'s alone."""
        assert self.normalizer is not None
        nets = self.nets if member is None else [self.nets[member]]
        for net in nets:
            net.eval()
        out = []
        with torch.no_grad():
            for start in range(0, len(programs), batch_size):
                batch = Batch(programs[start:start + batch_size], devices[start:start + batch_size], self.normalizer)
                z = torch.stack([net(batch.leaves, batch.mask, batch.devices, adapter) for net in nets]).mean(dim=0)
                out.append(self.normalizer.seconds(z, batch.gflops).numpy())
        return np.concatenate(out) if out else np.zeros(0)

    def fit(self, programs: Sequence[CompactAST], devices: np.ndarray, latencies: np.ndarray, *, steps: int,
            adapter: str | None = None, batch_size: int = 256, lr: float = 1e-3, mse_weight: float = 0.1,
            sample_weights: np.ndarray | None = None, seed: int = 0, rank_weight: float = 0.0,
            groups: np.ndarray | None = None, per_group: int = 16, checkpoint: str | None = None,
            settings: dict[str, Any] | None = None, on_step: Callable[[int, float], None] | None = None) -> float:
        """Train each member for ``steps`` minibatches (fitting the normalizer first if there is none), one after
        the other (member i draws its batches with ``seed`` + i); the last loss. ``on_step`` counts the steps of
        all members: ``steps`` x members in all.

        ``groups`` (a group id per program: its task and device) with ``rank_weight`` > 0 adds ``rank_loss``, and
        batches are then ``group_batch``es of ``per_group`` programs per group (unless ``sample_weights`` say
        which programs to draw). ``checkpoint``: a file the state is written to every CHECKPOINT_EVERY steps and
        when a member is done, and resumed from when a run with the same ``settings``, options and data wrote
        it."""
        if self.normalizer is None:
            if adapter is not None:
                raise ValueError("an adapter needs a trained network")
            self.normalizer = Normalizer.fit(programs, latencies)
        data = _TrainingData(programs, devices, latencies, self.normalizer, sample_weights,
                             groups if rank_weight > 0 else None)
        done, state = 0, None
        if checkpoint:
            digest = hashlib.sha256(np.asarray(latencies, dtype=np.float64).tobytes())
            digest.update(np.asarray(devices, dtype=np.float32).tobytes())
            for program in programs:  # their features too: another tunecore may compute them otherwise
                digest.update(program.features.tobytes())
                digest.update(program.positions.tobytes())
            settings = {**(settings or {}), "steps": steps, "adapter": adapter, "batch_size": batch_size, "lr": lr,
                        "mse_weight": mse_weight, "rank_weight": rank_weight, "per_group": per_group, "seed": seed,
                        "weighted": sample_weights is not None, "members": len(self.nets),
                        "data": digest.hexdigest()}
            done, state = load_checkpoint(checkpoint, "cdmpp", settings) or (0, None)
            if state:
                torch.set_rng_state(state["torch_rng"])  # dropout's, where an uninterrupted run stood
        loss_value = math.nan
        for member, net in enumerate(self.nets):
            first = member * steps  # the member's first step among all members' steps
            if done >= first + steps:  # trained before the interruption
                net.load_state_dict(state["finished"][member])
                continue
            resumed = state if done > first else None
            loss_value = self._fit_member(
                member, data, first, steps, resumed, adapter=adapter, batch_size=batch_size, lr=lr,
                mse_weight=mse_weight, seed=seed + member, rank_weight=rank_weight, per_group=per_group,
                checkpoint=checkpoint, settings=settings or {}, on_step=on_step)
        return loss_value

    def _fit_member(self, member: int, data: _TrainingData, first: int, steps: int, resumed: dict | None, *,
                    adapter: str | None, batch_size: int, lr: float, mse_weight: float, seed: int,
                    rank_weight: float, per_group: int, checkpoint: str | None, settings: dict[str, Any],
                    on_step: Callable[[int, float], None] | None) -> float:
        net = self.nets[member]
        normalizer = data.normalizer
        rng = np.random.default_rng(seed)
        if adapter is None:
            parameters = [p for name, p in net.named_parameters() if not name.startswith("adapters.")]
        else:
            net.add_adapter(adapter)
            parameters = list(net.adapters[adapter].parameters())
            embedded = self._embed(net, data.programs, normalizer)  # the frozen part, computed once
        optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=1e-4)
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=max(steps, 1))
        start = 0
        if resumed:
            start = resumed["step"]
            net.load_state_dict(resumed["net"])
            optimizer.load_state_dict(resumed["optimizer"])
            schedule.load_state_dict(resumed["schedule"])
            rng.bit_generator.state = resumed["rng"]  # the batches an uninterrupted run would draw next
        total = steps * len(self.nets)
        net.train()
        loss_value = math.nan
        for step in range(start, steps):
            if data.ranking_groups is not None and data.p is None:
                index = group_batch(data.ranking_groups, batch_size, per_group, rng)
            else:
                index = rng.choice(len(data.programs), size=min(batch_size, len(data.programs)),
                                   replace=data.p is not None, p=data.p)
            if adapter is None:
                batch = Batch([data.programs[i] for i in index], data.devices[index], normalizer)
                z = net(batch.leaves, batch.mask, batch.devices)
            else:
                z = net.head(embedded[index], data.device_tensor[index], adapter)
            loss = mse_weight * torch.mean((z - data.target[index]) ** 2) + torch.mean(
                torch.abs(normalizer.seconds(z, data.gflops[index]) - data.seconds[index]) / data.seconds[index])
            if data.ranking_groups is not None:
                loss = loss + rank_weight * rank_loss(z, data.target[index], data.group_tensor[index])
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(parameters, 1.0)
            optimizer.step()
            schedule.step()
            loss_value = loss.item()
            done = first + step + 1
            if on_step:
                on_step(done - 1, loss_value)
            if checkpoint and (done % CHECKPOINT_EVERY == 0 or step + 1 == steps) and done < total:
                finished = [n.state_dict() for n in self.nets[:member + (step + 1 == steps)]]
                save_checkpoint(checkpoint, "cdmpp", settings, done, {
                    "step": step + 1, "net": net.state_dict(), "optimizer": optimizer.state_dict(),
                    "schedule": schedule.state_dict(), "rng": rng.bit_generator.state,
                    "torch_rng": torch.get_rng_state(), "finished": finished})
        return loss_value

    def _embed(self, net: Net, programs: Sequence[CompactAST], normalizer: Normalizer,
               batch_size: int = 1024) -> torch.Tensor:
        net.eval()
        with torch.no_grad():
            return torch.cat([
                net.embed_programs(batch.leaves, batch.mask)
                for batch in (Batch(programs[i:i + batch_size], np.zeros((0, N_DEVICE_FEATURES)), normalizer)
                              for i in range(0, len(programs), batch_size))
            ])

    # the file

    def save(self, path: str) -> None:
        metadata = {"architecture": dataclasses.asdict(self.arch),
                    "normalizer": None if self.normalizer is None else dataclasses.asdict(self.normalizer),
                    "members": len(self.nets), "adapters": self.adapters, "trained_on": self.trained_on}
        save_model_torch(path, "cdmpp", VERSION, metadata, self._module().state_dict())

    def _module(self) -> nn.Module:
        return self.nets[0] if len(self.nets) == 1 else nn.ModuleList(self.nets)

    @classmethod
    def load(cls, path: str) -> Predictor:
        """A UsageError (one line) for a file that is not a cdmpp model of this version."""
        metadata, state_dict = load_model_torch(path, "cdmpp", VERSION)
        members = metadata.get("members", 1)
        if not isinstance(members, int) or not 1 <= members <= MAX_MEMBERS:
            raise UsageError(f"{path}: 'members' is {members!r}, not a count from 1 to {MAX_MEMBERS}")
        predictor = cls(Architecture(**metadata["architecture"]), members=members)
        for net in predictor.nets:
            for key in metadata.get("adapters", []):
                net.add_adapter(key)
        try:
            predictor._module().load_state_dict(state_dict)
        except (KeyError, RuntimeError) as e:
            raise UsageError(f"{path}: weights do not fit the architecture it names ({first_line(e)})") from None
        if metadata["normalizer"] is not None:
            predictor.normalizer = Normalizer(**metadata["normalizer"])
        predictor.trained_on = metadata.get("trained_on", {})
        return predictor
