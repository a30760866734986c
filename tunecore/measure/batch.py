"""Measuring built candidates on a machine that has TVM's runtime but not its compiler (a GPU box without a TVM
build): candidates are built here into a batch directory, timed there, and the results come back.

    here:   tunecore dataset export-batch ...    (tunecore.dataset.batch: builds; writes DIR/manifest.json, the
                                                 libraries, the tasks' reference outputs)
    there:  python -m tunecore.measure.batch DIR (this module: TVM's runtime libraries + tvm-ffi + numpy)
    here:   tunecore dataset import-batch DIR --out DATASET

On the device, ``import tvm`` without ``lib/libtvm_compiler.so`` falls back to the runtime library alone; the
CUDA runtime sidecar (``libtvm_runtime_cuda.so``) is loaded here, as TVM's compiler package would. Timing is
the label protocol's (tunecore.dataset.protocol: a warm-up call, then ``repeat`` timings of >= ``min_repeat_ms``
each, by TVM's own time evaluator) and every program's outputs are compared with its task's reference outputs,
computed where it was built by the unscheduled program on the host CPU: a wrong program comes back as a failed
result. ``DIR/results.json`` is rewritten as it goes, so a stopped run resumes where it stopped.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from tunecore.data import spread

MANIFEST = "manifest.json"
RESULTS = "results.json"
PROFILES = "profiles.json"  # program id -> profile metrics (a profiler's, e.g. tunecore_ncu_costmodel's)
CUBINS = "cubins"
CHUNK = 128  # programs compiled, then timed, at a time


def write_manifest(directory: str, target_json: str, tasks: dict[str, dict], programs: list[dict],
                   search: str = "random") -> None:
    """``tasks``: task key -> {"args": the task's argument infos, "weights": weight positions, "reference": the
    .npz of its outputs (a file name in ``directory``) or None}; ``programs``: {"id", "task", "library" (a file
    name in ``directory``), "args": the library's argument infos, "packing"}; ``search``: the policy that wrote
    them. Written whole or not at all: a pipeline waits for the file to appear before it times the batch."""
    path = os.path.join(directory, MANIFEST)
    with open(path + ".tmp", "w") as f:
        json.dump({"target": json.loads(target_json), "tasks": tasks, "programs": programs, "search": search}, f)
    os.replace(path + ".tmp", path)


def read_results(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, RESULTS)
    if not os.path.exists(path):
        return {"device": None, "results": {}}
    with open(path) as f:
        return json.load(f)


def load_runtime_sidecars() -> None:
    """Register the runtime libraries of device kinds (CUDA) beside ``libtvm_runtime.so``, where the compiler
    is absent (with it, ``tvm.backend.cuda`` does this)."""
    import ctypes

    import tvm

    runtime = tvm.base._LOADED_LIBS["tvm_runtime"]._name
    for name in ("libtvm_runtime_cuda.so",):
        path = os.path.join(os.path.dirname(os.path.realpath(runtime)), name)
        if os.path.exists(path):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:  # no CUDA driver here: only its kind is unusable
                pass


def cuda_source(library: str) -> str | None:
    """The CUDA source a library built for a GPU carries, or None (a CPU library). TVM 0.27's build leaves CUDA
    uncompiled: the library embeds a module blob of format ``cuda`` (the format string, the kernels' launch
    information, then the source as its last field, each length-prefixed), and the runtime compiles the source
    through ``tvm_callback_cuda_compile`` when the library is loaded."""
    import struct

    with open(library, "rb") as f:
        data = f.read()
    key = struct.pack("<Q", 4) + b"cuda"
    at = data.find(key)
    if at < 0:
        return None
    (size,) = struct.unpack_from("<Q", data, at + len(key))
    start, end = at + len(key) + 8, at + len(key) + 8 + size
    for position in range(start, end - 8):  # the source is the blob's last length-prefixed field
        if struct.unpack_from("<Q", data, position)[0] == end - position - 8:
            return data[position + 8:end].decode()
    return None


def compile_cuda(code: str, arch: str) -> bytes:
    """A cubin of ``code`` for ``arch``: NVRTC when ``cuda-bindings`` is installed (as TVM's own callback does), else
    or where NVRTC fails, ``nvcc --cubin -O3``."""
    try:
        from tvm.support import nvcc

        return nvcc.compile_cuda(code, target_format="cubin", arch=arch, compiler="nvrtc")
    except Exception as error:
        nvrtc_error = str(error).strip().splitlines()[-1:] if str(error).strip() else [type(error).__name__]
    try:
        return _nvcc_cubin(code, arch)
    except Exception as error:
        raise RuntimeError(f"{error} (NVRTC: {nvrtc_error[0][:200]})") from None


class Cubins:
    """The batch's compiled CUDA, ``DIR/cubins/<sha256 of the source>.<arch>.cubin``, made before the timing by a
    pool of processes (compiling takes up to seconds a program, timing a tenth of a second) and handed to TVM's
    runtime by its compile callback; a source not made before is compiled when its library is loaded. Kept in the
    batch, so a resumed run or the profiler's run compiles nothing twice."""

    def __init__(self, directory: str, arch: str):
        self.directory, self.arch = os.path.join(directory, CUBINS), arch
        self.made: dict[str, str] = {}  # cubin path -> the library it was compiled ahead for
        self.pool: Any = None
        self.counts = {"ahead": 0, "on_load": 0, "cached": 0}
        os.makedirs(self.directory, exist_ok=True)

    def path(self, code: str) -> str:
        import hashlib

        return os.path.join(self.directory, f"{hashlib.sha256(code.encode()).hexdigest()}.{self.arch}.cubin")

    def compile(self, libraries: list[str], workers: int | None = None) -> None:
        """Compile the CUDA of ``libraries`` not compiled yet, ``workers`` at a time (default: the cores less one),
        and wait for them all (a source that fails is compiled again when its library is loaded, where its error is
        the program's)."""
        import concurrent.futures
        import multiprocessing

        workers = max(1, (os.cpu_count() or 2) - 1) if workers is None else workers
        if self.pool is None and workers > 1:
            self.pool = concurrent.futures.ProcessPoolExecutor(workers,
                                                               mp_context=multiprocessing.get_context("spawn"))
        jobs = {}
        for library in libraries:
            code = cuda_source(library)
            path = None if code is None else self.path(code)
            if path and path not in jobs and not os.path.exists(path):
                jobs[path] = library
        if self.pool is None:
            for path, library in jobs.items():
                _try(_write_library_cubin, library, self.arch, path)
        else:
            concurrent.futures.wait([self.pool.submit(_try, _write_library_cubin, library, self.arch, path)
                                     for path, library in jobs.items()])
        self.made.update(jobs)

    def get(self, code: str) -> bytes:
        path = self.path(code)
        if os.path.exists(path):
            self.counts["ahead" if path in self.made else "cached"] += 1
        else:
            _write_cubin(code, self.arch, path)
            self.counts["on_load"] += 1
        with open(path, "rb") as f:
            return f.read()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def _try(function: Any, *args: Any) -> None:
    try:
        function(*args)
    except Exception:
        pass


def _write_library_cubin(library: str, arch: str, path: str) -> None:
    """(the source is read in the process that compiles it rather than sent to it)"""
    _write_cubin(cuda_source(library) or "", arch, path)


def _write_cubin(code: str, arch: str, path: str) -> None:
    binary = compile_cuda(code, arch)
    with open(f"{path}.{os.getpid()}", "wb") as f:
        f.write(binary)
    os.replace(f"{path}.{os.getpid()}", path)


def _nvcc_cubin(code: str, arch: str) -> bytes:
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tunecore-cuda-") as directory:
        source, cubin = os.path.join(directory, "kernels.cu"), os.path.join(directory, "kernels.cubin")
        with open(source, "w") as f:
            f.write(code)
        done = subprocess.run(["nvcc", "--cubin", "-O3", f"-arch={arch}", "-o", cubin, source], capture_output=True,
                              text=True)
        if done.returncode != 0:
            raise RuntimeError(f"nvcc: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'failed'}")
        with open(cubin, "rb") as f:
            return f.read()


def use_cubins(cubins: Cubins) -> None:
    """TVM's runtime compiles a library's CUDA source when the library is loaded, through its compile callback;
    this one takes the batch's cubins (TVM's own callback, where the compiler is installed, asks the compiler's
    current target for the architecture, which the runtime alone does not have)."""
    import tvm_ffi

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def compile_for_this_gpu(code: str, *_: Any) -> bytes:
        return cubins.get(code)


def this_device(target: dict[str, Any], device: Any) -> dict[str, Any]:
    """The device as tunecore.targets.device_descriptor describes it, from the runtime alone: a CPU's vector
    features are read from /proc/cpuinfo instead of LLVM, so a batch timed on this machine and a run measured here
    name the same device."""
    from tunecore.targets import _cpu_flags, cpu_descriptor, gpu_descriptor, physical_cores

    kind = target["kind"]
    if kind in ("llvm", "c"):
        return {**cpu_descriptor(str(target.get("mcpu", "")), int(target.get("num-cores", physical_cores())),
                                 _cpu_flags()), "kind": kind}
    return gpu_descriptor(kind, str(target.get("arch", "")), device)


def run_batch(directory: str, *, repeat: int = 5, min_repeat_ms: float = 20.0, max_spread: float = 0.02,
              save_every: float = 30.0, compile_workers: int | None = None, limit_s: float | None = None,
              log: Any = sys.stderr) -> dict[str, Any]:
    """Time and check every program of the batch not timed yet; returns the results file's content. A program
    whose timings spread (std/mean) more than ``max_spread`` is timed once more and flagged if it still does
    (tunecore.dataset.protocol's ``label.*`` entries). CUDA is compiled ahead by ``compile_workers`` processes
    (default: the cores less one); after ``limit_s`` seconds the run stops and saves (run it again to resume)."""
    from tunecore.dataset.protocol import ForeignLoad
    from tunecore.targets import use_threads

    started = time.perf_counter()
    manifest, kind, device, cubins = _open_batch(directory)
    if not device.exist:
        raise RuntimeError(f"there is no {kind} device on this machine")
    done = read_results(directory)
    done["device"] = this_device(manifest["target"], device)
    if kind == "llvm":  # a CPU batch's kernels on as many threads as its target has cores, as a network runs them
        done["threads"] = use_threads(int(manifest["target"].get("num-cores", 0)))
    references: dict[str, tuple[list, dict[int, Any]] | None] = {}
    todo = [p for p in manifest["programs"] if "library" in p and p["id"] not in done["results"]]
    try:
        # compiling and timing take turns: a busy host slows the launches of short kernels (up to 1.7x on the
        # H100 when a pool compiled beside the timing), so nothing of the batch's own runs while it is timed
        for start in range(0, len(todo), CHUNK):
            chunk = todo[start:start + CHUNK]
            if cubins is not None:
                cubins.compile([os.path.join(directory, p["library"]) for p in chunk], compile_workers)
            load = ForeignLoad(children=False)
            stopped = _time_programs(directory, manifest, chunk, device, done, references, repeat, min_repeat_ms,
                                     max_spread, save_every, limit_s, started, log)
            host_load = load.cores()
            timed = [p for p in chunk if p["id"] in done["results"]]
            for program in timed:
                done["results"][program["id"]].setdefault("host_load", host_load)
            print(f"{start + len(timed)}/{len(todo)} timed (host load {host_load} cores)", file=log, flush=True)
            if stopped:
                break
    finally:
        if cubins is not None:
            cubins.close()
            done["cubins"] = {k: done.get("cubins", {}).get(k, 0) + v for k, v in cubins.counts.items()}
        _save(directory, done)
    return done


def _time_programs(directory: str, manifest: dict, todo: list[dict], device: Any, done: dict, references: dict,
                   repeat: int, min_repeat_ms: float, max_spread: float, save_every: float, limit_s: float | None,
                   started: float, log: Any) -> bool:
    """Time ``todo``; True if the time limit stopped it."""
    results, saved = done["results"], time.perf_counter()
    for count, program in enumerate(todo, 1):
        task = manifest["tasks"][program["task"]]
        if program["task"] not in references:
            references[program["task"]] = _reference(directory, task)
        try:
            path = os.path.join(directory, program["library"])
            result = _time_and_check(path, program, device, references[program["task"]], repeat, min_repeat_ms)
            result["attempts"] = 1
            if result["error"] is None and max_spread > 0 and (spread(result["run_secs"]) or 0) > max_spread:
                again = _time_and_check(path, program, device, None, repeat, min_repeat_ms)
                result.update(run_secs=again["run_secs"], attempts=2,
                              noisy=(spread(again["run_secs"]) or 0) > max_spread)
            results[program["id"]] = result
        except Exception as error:  # the library does not load or its kernel fails: a failed result
            results[program["id"]] = {"run_secs": None, "error": "run: " + str(error).strip().splitlines()[-1][:300]}
        if time.perf_counter() - saved > save_every:
            _save(directory, done)
            saved = time.perf_counter()
        if limit_s is not None and time.perf_counter() - started > limit_s:
            print(f"stopped after {limit_s:.0f} s (run again to resume)", file=log, flush=True)
            return True
    return False


def _reference(directory: str, task: dict) -> tuple[list, dict[int, Any]] | None:
    import numpy as np

    from tunecore.check import task_inputs

    if not task.get("reference"):
        return None
    with np.load(os.path.join(directory, task["reference"]), allow_pickle=False) as saved:
        outputs = {int(name.split("_")[1]): saved[name] for name in saved.files}
    return task_inputs(task["args"], task["weights"]), outputs


def _open_batch(directory: str) -> tuple[dict, str, Any, Cubins | None]:
    """The batch's manifest, its target's kind, this machine's device of that kind, and for CUDA the batch's
    cubins for this GPU, handed to the runtime when it loads a library (the runtime's sidecars loaded)."""
    import tvm

    load_runtime_sidecars()
    with open(os.path.join(directory, MANIFEST)) as f:
        manifest = json.load(f)
    kind = manifest["target"]["kind"]
    device = tvm.cpu(0) if kind in ("llvm", "c") else tvm.device(kind, 0)
    cubins = None
    if kind == "cuda" and device.exist:
        cubins = Cubins(directory, "sm_" + device.compute_version.replace(".", ""))
        use_cubins(cubins)
    return manifest, kind, device, cubins


def batch_cubins(directory: str) -> Cubins | None:
    """The batch's cubins for this machine's GPU (None for a CPU batch or where its GPU is absent), to compile ahead
    of a run that should not compile, e.g. one under a profiler: ``cubins.compile(libraries)``, then
    ``cubins.close()``."""
    return _open_batch(directory)[3]


def _random_arguments(program: dict, device: Any, rng: Any) -> list:
    """Random floats, zero integers (often indices), as the local runner fills unchecked arguments."""
    import numpy as np
    import tvm

    return [tvm.runtime.tensor(rng.random(shape).astype(dtype) if dtype.startswith(("float", "bfloat"))
                               else np.zeros(shape, dtype=dtype), device) for _, dtype, shape in program["args"]]


def _time_and_check(path: str, program: dict, device: Any, reference: tuple | None, repeat: int,
                    min_repeat_ms: float) -> dict[str, Any]:
    import math

    import numpy as np
    import tvm

    from tunecore.check import mismatch

    module = tvm.runtime.load_module(path)
    function = module[module.entry_name]
    if reference is not None and program.get("packing") is None:
        inputs, outputs = reference
        args = [tvm.runtime.tensor(x, device) for x in inputs]
    else:
        outputs = None
        args = _random_arguments(program, device, np.random.default_rng(0))
    start = time.perf_counter()
    function(*args)  # the warm-up call; also the call whose outputs are checked
    device.sync()
    once = max(time.perf_counter() - start, 1e-7)
    verdict = None
    if outputs is not None:
        verdict = mismatch([args[i].numpy() for i in sorted(outputs)], [outputs[i] for i in sorted(outputs)])
    number = max(1, math.ceil(min_repeat_ms / 1e3 / once))
    evaluator = module.time_evaluator(module.entry_name, device, number=number, repeat=repeat,
                                      min_repeat_ms=int(min_repeat_ms))
    secs = [float(s) for s in evaluator(*args).results]
    result: dict[str, Any] = {"run_secs": secs, "error": None}
    if verdict is not None:
        result["max_relative_error"], result["error"] = verdict
    return result


def call_once(directory: str, ids: list[str] | None = None, log: Any = sys.stderr) -> list[list]:
    """Call each program (or those of ``ids``) once, in manifest order, as a profiler (ncu) wants them; returns
    [[id, None or why it failed], ...] in call order (also written to ``DIR/calls.json``)."""
    import numpy as np
    import tvm

    manifest, _, device, _ = _open_batch(directory)
    wanted = None if ids is None else set(ids)
    calls: list[list] = []
    rng = np.random.default_rng(0)
    for program in manifest["programs"]:
        if "library" not in program or (wanted is not None and program["id"] not in wanted):
            continue
        try:
            module = tvm.runtime.load_module(os.path.join(directory, program["library"]))
            args = _random_arguments(program, device, rng)
            device.sync()
            module[module.entry_name](*args)
            device.sync()
            calls.append([program["id"], None])
        except Exception as error:
            calls.append([program["id"], str(error).strip().splitlines()[-1][:300]])
    with open(os.path.join(directory, "calls.json"), "w") as f:
        json.dump(calls, f)
    return calls


def device_kernels(library: str) -> list[str]:
    """The GPU kernels a built library defines, in its source's order, from the CUDA source TVM embeds in it
    (for matching a profiler's kernel launches to programs); [] for a CPU library."""
    import re

    pattern = r'__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\([^;{]*\) ?\{'
    return list(dict.fromkeys(re.findall(pattern, cuda_source(library) or "")))


def _save(directory: str, done: dict[str, Any]) -> None:
    path = os.path.join(directory, RESULTS)
    with open(path + ".tmp", "w") as f:
        json.dump(done, f)
    os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tunecore.measure.batch", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="a batch directory written by `tunecore dataset export-batch`")
    parser.add_argument("--repeat", type=int, default=5, help="timings per program (default 5)")
    parser.add_argument("--min-repeat-ms", type=float, default=20.0, help="milliseconds per timing (default 20)")
    parser.add_argument("--compile-workers", type=int, default=None,
                        help="processes compiling CUDA ahead of the timing (default: the cores less one)")
    parser.add_argument("--limit-s", type=float, default=None, help="stop after this many seconds (resumable)")
    parser.add_argument("--call-once", metavar="IDS", nargs="?", const="",
                        help="call each program once, untimed (for a profiler), or only those listed in the JSON "
                             "file IDS")
    args = parser.parse_args(argv)
    if not os.path.exists(os.path.join(args.directory, MANIFEST)):
        print(f"tunecore: {args.directory}: no {MANIFEST} (not a batch directory)", file=sys.stderr)
        return 2
    if args.call_once is not None:
        ids = json.load(open(args.call_once)) if args.call_once else None
        calls = call_once(args.directory, ids)
        print(json.dumps({"called": len(calls), "failed": sum(c[1] is not None for c in calls)}))
        return 0
    done = run_batch(args.directory, repeat=args.repeat, min_repeat_ms=args.min_repeat_ms,
                     compile_workers=args.compile_workers, limit_s=args.limit_s)
    failed = sum(r["error"] is not None for r in done["results"].values())
    print(json.dumps({"device": done["device"], "programs": len(done["results"]), "failed": failed,
                      "cubins": done.get("cubins")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
