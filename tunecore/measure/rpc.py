"""The ``rpc`` runner: times candidates on every device registered with a TVM RPC tracker under one key (the
boards run tunecore.measure.board).

    tunecore run ... -O measurer.runner=rpc -O measurer.tracker=HOST:PORT -O measurer.key=KEY

Each candidate gets its own session, requested from the tracker, so it runs on whichever device is free,
all devices at once. What can go wrong, and what becomes of it:

- Waiting for a free device is not part of a candidate's time; it is bounded by ``queue_timeout``
  (default 60 s), after which the run stops with one clear line ("no device ...") and a non-zero exit.
- The candidate's own time is bounded by ``run_timeout`` from the moment its session starts: the
  server ends the session then (a timed-out result), and if the server does not answer at all a few
  seconds later, the device is taken as hung.
- A device that cannot be reached, drops the connection while nothing of the candidate ran, or hangs,
  is an *outage*: it is taken out of the run and the candidate is retried on another device; nothing is
  recorded for it. A candidate that loses ``device_retries + 1`` devices in a row is recorded as failed,
  so that a kernel that kills every board it touches cannot take the whole fleet down.
- A session that dies while the kernel runs, on a server that comes back (``tunecore fleet server``
  restarts TVM's server when a kernel crashes it), is the candidate's crash: a failed result.

Records carry the remote device's identity, read from the device: ``tunecore fleet server`` answers
with tunecore's own device descriptor; a plain TVM server is described by LLVM's name for its CPU
(GPU: the device's attributes). Devices under one key must be the same device.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import statistics
import struct
import sys
import threading
import time
from typing import Any, Callable, Sequence

from tunecore.data import MeasureResult, Task
from tunecore.errors import MeasurerUnavailable, UsageError, error_line
from tunecore.measure.local import OutputCheck, Screen, apply_verdict
from tunecore.options import check_options, is_int, is_number
from tunecore.roles import Artifact, Profiler, Runner

DESCRIBE_FUNCTION = "tunecore.device_descriptor"  # registered on the device by `tunecore fleet server`
_CONNECT_TIMEOUT_S = 15.0  # connecting and reading the device's identity
_GRACE_S = 10.0  # after run_timeout, how long the server has to report that it ended the session
_REVIVE_S = 25.0  # how long a crashed server has to register again before its device counts as lost


def parse_address(text: str, option: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port), or a one-line usage error naming the option."""
    host, _, port = str(text).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{option} must be HOST:PORT, not {text!r}")
    return host, int(port)


class Tracker:
    """A client of TVM's RPC tracker speaking its JSON protocol (tvm.rpc.base), one socket per call,
    so that every wait is bounded: tvm.rpc's own client blocks for ever on a busy key."""

    def __init__(self, address: tuple[str, int]):
        self.address = address

    def _open(self, timeout: float) -> socket.socket:
        from tvm.rpc import base

        try:
            sock = socket.create_connection(self.address, timeout=min(timeout, _CONNECT_TIMEOUT_S))
            sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            if struct.unpack("<i", base.recvall(sock, 4))[0] != base.RPC_TRACKER_MAGIC:
                raise ConnectionError("it is not a TVM RPC tracker")
        except (OSError, ConnectionError) as error:
            raise MeasurerUnavailable(f"cannot reach the RPC tracker at {self.label()}: {error}") from None
        sock.settimeout(timeout)
        return sock

    def label(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    def summary(self, timeout: float = _CONNECT_TIMEOUT_S) -> dict[str, Any]:
        from tvm.rpc import base

        try:
            with self._open(timeout) as sock:
                base.sendjson(sock, [base.TrackerCode.SUMMARY])
                reply = base.recvjson(sock)
        except (OSError, struct.error, ValueError) as error:  # it went down while answering (killed, restarting)
            raise MeasurerUnavailable(f"lost the RPC tracker at {self.label()}: {error}") from None
        return reply[1] if isinstance(reply, list) and reply and reply[0] == base.TrackerCode.SUCCESS else {}

    def servers(self, key: str) -> list[tuple[str, int]]:
        """Addresses of the servers registered under ``key`` (busy ones included)."""
        info = self.summary().get("server_info", [])
        return [(s["addr"][0], int(s["addr"][1])) for s in info if s.get("key") == f"server:{key}"]

    def request(self, key: str, timeout: float, patience: float | None = None) -> tuple[str, int, str]:
        """A free device: (host, port, match key), waiting at most ``timeout`` seconds for one, through
        tracker restarts (servers register again when it is back). ``patience``: the whole wait the caller
        allows, for the message (default: ``timeout``)."""
        from tvm.rpc import base

        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                with self._open(max(remaining, 0.1)) as sock:
                    base.sendjson(sock, [base.TrackerCode.REQUEST, key, "", 1])
                    reply = base.recvjson(sock)
                host, port, match_key = reply[1]
                return host, int(port), match_key
            except (socket.timeout, TimeoutError):
                break
            except (MeasurerUnavailable, OSError, ConnectionError, struct.error):
                if time.monotonic() + 1.0 > deadline:
                    break
                time.sleep(1.0)  # the tracker is down or restarting
        raise MeasurerUnavailable(
            f"no device under key '{key}' at the RPC tracker {self.label()} was free within {patience or timeout:g} s "
            f"(see `tunecore fleet status --tracker {self.label()}`)")


class _Outage(Exception):
    """The device, not the candidate, failed: take it out and try the candidate on another."""


class _Crash(Exception):
    """The session died while the candidate's kernel ran."""


def _round_trip(device: Any) -> float:
    """Seconds that a timed remote call (a call and a sync: two round trips) costs with nothing to do, the
    fastest of three: the part of its time that the network, not the kernel, takes."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        device.sync()
        device.sync()
        best = min(best, time.perf_counter() - start)
    return best


def _within(seconds: float, function: Callable[[], Any]) -> Any:
    """``function()`` on a daemon thread, given up after ``seconds``: an RPC call on a hung device never
    returns, and the thread is left to it."""
    out: dict[str, Any] = {}

    def call() -> None:
        try:
            out["value"] = function()
        except BaseException as error:  # handed to the caller
            out["error"] = error

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise _Outage(f"the device did not answer within {seconds:g} s")
    if "error" in out:
        raise out["error"]
    return out["value"]


def describe_remote(session: Any, target: Any) -> dict[str, Any]:
    """The device behind an RPC session, read from the device itself."""
    from tunecore.tvmjson import target_to_json

    try:
        describe = session.get_function(DESCRIBE_FUNCTION)
    except Exception:  # a plain TVM server: what TVM's runtime there can tell
        describe = None
    if describe is not None:
        return json.loads(describe(target_to_json(target)))
    kind = target.kind.name
    if kind != "llvm":
        from tunecore.targets import gpu_descriptor

        return gpu_descriptor(kind, str(target.attrs.get("arch", "")), session.device(kind, 0), remote=True)
    return {"kind": kind, "cpu": "llvm:" + str(session.get_function("target.llvm_get_system_cpu")()),
            "triple": str(session.get_function("target.llvm_get_system_triple")()),
            "mcpu": str(target.attrs.get("mcpu", "")), "cores": int(target.attrs.get("num-cores", 0)) or None}


class RpcRunner(Runner, Screen, OutputCheck):
    """Times candidates on the devices a TVM RPC tracker has under ``key`` (see the module docstring).

    The check's reference outputs are computed on a device under the key and kept here; each checked
    candidate's outputs are read back from its device and compared here.
    """

    name = "rpc"
    runs_profilers = False  # a profiler runs where the candidate runs, and that is another machine
    needs_reference = OutputCheck.needs_reference  # not Runner's (it checks nothing)

    def __init__(self, target: Any, *, tracker: str = "", key: str = "", run_timeout: float = 20.0,
                 queue_timeout: float = 60.0, device_retries: int = 2, repeat: int = 3, number: int = 1,
                 min_repeat_ms: int = 20, cpu_cache_flush: bool = False, screen: float = 2.0, check: str = "all",
                 check_sample: int = 8, reference_timeout: float = 300.0, **options: Any):
        super().__init__(target, **options)
        OutputCheck.__init__(self, check, check_sample)
        self.reference_timeout = float(reference_timeout)
        if not tracker or not key:
            raise UsageError("the rpc runner needs -O measurer.tracker=HOST:PORT and -O measurer.key=KEY")
        check_options(run_timeout=(run_timeout, is_number(run_timeout, 0.001), "a number of seconds > 0"),
                      queue_timeout=(queue_timeout, is_number(queue_timeout, 0.001), "a number of seconds > 0"),
                      device_retries=(device_retries, is_int(device_retries, 0), "an integer >= 0"))
        Screen.__init__(self, screen)
        from tunecore.tvmjson import target_to_json

        self.tracker = Tracker(parse_address(tracker, "measurer.tracker"))
        self.key = str(key)
        self.run_timeout = float(run_timeout)
        self.queue_timeout = float(queue_timeout)
        self.device_retries = device_retries
        self.evaluator = dict(number=number, repeat=repeat, min_repeat_ms=min_repeat_ms,
                              enable_cpu_cache_flush=cpu_cache_flush)
        self.target_json = target_to_json(target)
        self.lost: dict[tuple[str, int], str] = {}  # device address -> why it was taken out
        self.identities: dict[tuple[str, int], dict[str, Any]] = {}
        self._device: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self.capacity = max(1, len(self.tracker.servers(self.key)))

    def ready(self) -> None:
        self.device()

    def device(self) -> dict[str, Any]:
        """The device of the first session: every device under the key must be this one."""
        deadline = time.monotonic() + self.queue_timeout
        while self._device is None:
            host, port, match_key = self.tracker.request(self.key, max(deadline - time.monotonic(), 0.1),
                                                         self.queue_timeout)
            try:
                session = self._connect(host, port, match_key, timeout=_CONNECT_TIMEOUT_S)
                self._device = self._identity((host, port), session)
            except _Outage as outage:
                self._take_out((host, port), str(outage))
        return self._device

    def _identity(self, address: tuple[str, int], session: Any) -> dict[str, Any]:
        if address not in self.identities:
            try:
                self.identities[address] = _within(_CONNECT_TIMEOUT_S, lambda: describe_remote(session, self.target))
            except _Outage:
                raise
            except Exception as error:
                raise _Outage(f"cannot read its identity: {error_line(error)}") from None
        return self.identities[address]

    def _connect(self, host: str, port: int, match_key: str, timeout: float) -> Any:
        from tvm import rpc

        try:
            return _within(_CONNECT_TIMEOUT_S, lambda: rpc.connect(host, port, match_key, session_timeout=timeout))
        except _Outage:
            raise
        except Exception as error:
            raise _Outage(f"cannot connect: {error_line(error)}") from None

    def set_reference(self, task: Task, reference: Artifact | str) -> None:
        from tunecore.check import task_inputs, weight_arguments, written_arguments
        from tunecore.measure.worker import reference_outputs

        if isinstance(reference, str):
            return self.no_reference(task, f"failed to build ({reference})")
        inputs = task_inputs(task.args, weight_arguments(task.mod))
        written = written_arguments(task.mod)
        try:
            host, port, match_key = self.tracker.request(self.key, self.queue_timeout, self.queue_timeout)
            session = self._connect(host, port, match_key, timeout=self.reference_timeout)

            def outputs() -> dict[int, Any]:
                session.upload(reference.path)
                module = session.load_module(os.path.basename(reference.path))
                kind = self.target.kind.name
                device = session.cpu(0) if kind in ("llvm", "c") else session.device(kind, 0)
                return reference_outputs(module, device, inputs, written)

            found = _within(self.reference_timeout + _GRACE_S, outputs)
        except Exception as error:
            return self.no_reference(task, f"failed to run on a device under key '{self.key}' ({error_line(error)})")
        self.references[task.task_id] = {"inputs": inputs, "outputs": found}

    def run(self, task: Task, artifacts: Sequence[Artifact], profilers: Sequence[Profiler]) -> list[MeasureResult]:
        self.ready()
        try:
            devices = len([s for s in self.tracker.servers(self.key) if s not in self.lost])
        except MeasurerUnavailable:  # the tracker restarts: requests wait for it, up to queue_timeout
            devices = self.capacity
        workers = max(1, min(len(artifacts), devices))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            return list(pool.map(lambda artifact: self._measure(task, artifact), artifacts))

    def _measure(self, task: Task, artifact: Artifact) -> MeasureResult:
        result = MeasureResult(build_secs=artifact.build_secs)
        reference, check = self.reference(task), None
        if reference is not None:
            always, below = self.check_below(self.best.get(task.task_id))
            check = dict(reference, packing=artifact.packing, below=None if always else below)
        lost: list[str] = []  # devices lost while this candidate ran on them
        waiting_since = time.monotonic()
        while len(lost) <= self.device_retries:
            waited = time.monotonic() - waiting_since
            host, port, match_key = self.tracker.request(self.key, max(self.queue_timeout - waited, 0.1),
                                                         self.queue_timeout)
            address = (host, port)
            if address in self.lost:  # taken out, but still registered (it hangs, or it is another device)
                if waited > self.queue_timeout:
                    raise MeasurerUnavailable(f"no device under key '{self.key}' is left: "
                                              + "; ".join(f"{h}:{p} {why}" for (h, p), why in self.lost.items()))
                continue
            try:
                result.run_secs, verdict = self._run_on(address, match_key, task, artifact, check)
                apply_verdict(result, verdict)
                self.saw(task.task_id, result.latency)
                return result
            except _Outage as outage:
                self._take_out(address, str(outage))
                lost.append(f"{host}:{port}: {outage}")
            except _Crash as crash:
                if self._came_back(address):
                    result.error = f"run: {crash}"
                    return result
                self._take_out(address, f"{crash}, and the server did not come back")
                lost.append(f"{host}:{port}: {crash}")
            except Exception as error:  # the device said the candidate failed
                result.error = "run: " + error_line(error)
                return result
            waiting_since = time.monotonic()
        result.error = f"run: {len(lost)} devices were lost while running it (last {lost[-1]})"
        return result

    def _run_on(self, address: tuple[str, int], match_key: str, task: Task, artifact: Artifact,
                check: dict[str, Any] | None) -> tuple[list[float], tuple[float, str | None] | None]:
        """The candidate's timings on one device and the check's verdict (see ``worker.run``); raises _Outage,
        _Crash, or the device's error."""
        from tvm.s_tir.meta_schedule.runner.utils import alloc_argument_common

        from tunecore.measure.worker import checked_arguments, compare_outputs, make_fill, time_function
        from tunecore.targets import device_id

        session = self._connect(*address, match_key, timeout=self.run_timeout)
        identity = self._identity(address, session)
        if device_id(identity) != device_id(self.device()):
            raise _Outage(f"it is not the device this run measures on ({identity} is not {self.device()}); "
                          "give each kind of device its own key")
        name = os.path.basename(artifact.path)

        def upload() -> Any:
            session.upload(artifact.path)
            return session.load_module(name)

        started = time.monotonic()
        try:
            module = _within(self.run_timeout + _GRACE_S, upload)
        except _Outage:
            raise
        except Exception as error:
            if _alive(session):
                raise  # the device refused the library: the candidate's failure
            raise _Outage(f"lost while uploading: {error_line(error)}") from None
        kind = self.target.kind.name
        device = session.cpu(0) if kind in ("llvm", "c") else session.device(kind, 0)
        screen_above = self.screen_above(task.task_id)

        def timed() -> tuple[list[float], tuple[float, str | None] | None]:
            cores = int(self.target.attrs.get("num-cores", 0)) if kind == "llvm" else 0
            if cores:  # as many threads as the target has cores, as here (at most what the server allows)
                session.get_function("runtime.config_threadpool")(1, cores)  # 1: TVM's default affinity
                threads = session.get_function("runtime.NumThreads")()
                if threads < cores:  # a plain TVM server uses half the CPUs it counts: wrong latencies
                    raise _Outage(f"it runs kernels on {threads} threads and the target has {cores} cores; start "
                                  f"its server with TVM_NUM_THREADS={cores}")
            overhead = _round_trip(device)
            if check is None:
                fill = make_fill(session.get_function("tvm.contrib.random.random_fill_for_measure"))
                args = alloc_argument_common(fill, device, artifact.arguments(task), 1)
                return time_function(module, device, args, self.evaluator, screen_above, overhead), None
            args = checked_arguments(module, device, check["inputs"], artifact.arguments(task), check["packing"])
            secs = time_function(module, device, [args], self.evaluator, screen_above, overhead)
            if check["below"] is not None and statistics.median(secs) >= check["below"]:
                return secs, None
            return secs, compare_outputs(args, check["outputs"])

        remaining = self.run_timeout - (time.monotonic() - started)
        try:
            timings = _within(max(remaining, 0.0) + _GRACE_S, timed)
        except _Outage:
            raise
        except Exception as error:
            if "RPCSessionTimeoutError" in str(error):
                raise TimeoutError(f"timed out after {self.run_timeout:g} s") from None
            if _alive(session):
                raise
            raise _Crash("the kernel crashed the RPC session") from None
        try:
            session.get_function("tvm.rpc.server.remove")(name)
        except Exception:  # the session's directory goes with it anyway
            pass
        return timings

    def _take_out(self, address: tuple[str, int], why: str) -> None:
        with self._lock:
            if address not in self.lost:
                self.lost[address] = why
                print(f"tunecore: rpc device {address[0]}:{address[1]} under key '{self.key}' is taken out of "
                      f"this run: {why}", file=sys.stderr)

    def _came_back(self, address: tuple[str, int]) -> bool:
        """Whether a server whose session died is registered with the tracker again (``tunecore fleet server``
        restarts TVM's server, which exits when a session crashes), after the tracker saw it go."""
        time.sleep(1.0)
        deadline = time.monotonic() + _REVIVE_S
        while time.monotonic() < deadline:
            try:
                if address in self.tracker.servers(self.key):
                    return True
            except MeasurerUnavailable:
                pass
            time.sleep(0.5)
        return False


def _alive(session: Any) -> bool:
    try:
        _within(5.0, lambda: session.get_function("runtime.NumThreads")())
        return True
    except BaseException:
        return False
