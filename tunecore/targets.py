"""Targets: what ``--target`` means, and what a target's device looks like.

``llvm`` is this host with its real ``mcpu`` (without one LLVM emits SSE-only code and kernels run
about 2x slower) and its core count; ``cuda`` the local GPU; anything else is a TVM JSON target dict.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import sys
import types
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tunecore.errors import UsageError, first_line

# public (see tunecore.interfaces): what plugins may import from this module
__all__ = ["cpu_lineage", "data_caches", "device_descriptor", "device_id", "host_target", "model_threads",
           "physical_cores", "resolve_target"]

if TYPE_CHECKING:
    import tvm

# Best first: the mcpu LLVM should tune for, by the flags /proc/cpuinfo reports.
_X86_MCPU_BY_FLAGS = (
    ({"avx512f", "amx_tile"}, "sapphirerapids"),
    ({"avx512f", "avx512_vnni"}, "cascadelake"),
    ({"avx512f"}, "skylake-avx512"),
    ({"avx2", "fma"}, "haswell"),
    ({"sse4_2"}, "nehalem"),
)
# Each CPU's predecessor in its line (LLVM's names). A tool or a model that does not know a CPU takes its nearest
# predecessor it knows instead: llvm-mca and tlm's vocabulary, which are older than the CPUs they are asked about.
_CPU_PREDECESSOR = {"znver5": "znver4", "znver4": "znver3", "znver3": "znver2", "znver2": "znver1",
                    "graniterapids": "sapphirerapids", "emeraldrapids": "sapphirerapids",
                    "sapphirerapids": "icelake-server", "arrowlake": "alderlake", "meteorlake": "alderlake",
                    "raptorlake": "alderlake", "alderlake": "skylake"}
# /proc/cpuinfo flag -> LLVM feature, for the features that decide code generation
_DECISIVE_FEATURES = {"avx512f": "avx512f", "avx2": "avx2", "fma": "fma", "amx_tile": "amx-tile"}


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if ":" in line:
                    key, value = (s.strip() for s in line.split(":", 1))
                    info.setdefault(key, value)
    except OSError:
        pass
    return info


def _cpu_flags() -> set[str]:
    return set(_cpuinfo().get("flags", "").split())


def physical_cores() -> int:
    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def model_threads() -> int:
    """Threads for training and running learned models (torch, xgboost): OMP_NUM_THREADS when set, the usual way
    to give a job its share of a machine (an OpenMP pool wider than its share spins against the other jobs:
    torch training ran 3-7x slower beside another process), else the physical cores."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else physical_cores()


def use_target_threads(target: Any) -> int:
    """Make TVM's runtime thread pool in this process (and processes it starts) as wide as the target.

    Without TVM_NUM_THREADS, TVM's runtime halves the CPU count on x86 on the assumption of
    hyper-threading; on a machine without it, parallel kernels silently run on half the cores.
    Call before the first kernel runs: the pool reads the variable once. A user's setting wins.
    """
    return use_threads(int(target.attrs.get("num-cores", 0)) if target.kind.name == "llvm" else 0)


def use_threads(cores: int) -> int:
    """use_target_threads with the target's core count (0: this machine's physical cores); for a process that has
    TVM's runtime alone (no Target to read)."""
    # a value tunecore set earlier (here or in a parent process) is not the user's
    if "TVM_NUM_THREADS" not in os.environ or os.environ.get("TUNECORE_SET_TVM_NUM_THREADS"):
        os.environ["TVM_NUM_THREADS"] = str(cores or physical_cores())
        os.environ["TUNECORE_SET_TVM_NUM_THREADS"] = "1"
    return int(os.environ["TVM_NUM_THREADS"])


@functools.lru_cache(maxsize=None)
def host_mcpu() -> str:
    """The LLVM CPU name to compile for on this host.

    LLVM's own host name is used when its decisive vector features match what the CPU reports
    (it can misname a CPU, e.g. an AVX-512 part as a core without it); otherwise the flags decide.
    """
    import tvm
    from tvm.target import codegen

    flags = _cpu_flags()
    name = str(codegen.llvm_get_system_cpu())
    if name and name != "generic":
        features = codegen.llvm_get_cpu_features(tvm.target.Target({"kind": "llvm", "mcpu": name}))
        if all((flag in flags) == (feature in features) for flag, feature in _DECISIVE_FEATURES.items()):
            return name
    for required, mcpu in _X86_MCPU_BY_FLAGS:
        if required <= flags:
            return mcpu
    return name or "generic"


def cpu_lineage(mcpu: str) -> list[str]:
    """``mcpu`` and then its predecessors in its line, nearest first (``[mcpu]`` for a CPU without a known one)."""
    out = [mcpu]
    while out[-1] in _CPU_PREDECESSOR:
        out.append(_CPU_PREDECESSOR[out[-1]])
    return out


def host_target() -> Any:
    import tvm

    return tvm.target.Target({"kind": "llvm", "mcpu": host_mcpu(), "num-cores": physical_cores()})


def resolve_target(spec: str | None) -> Any:
    """A ``tvm.target.Target`` from what a user typed; UsageError if TVM cannot make sense of it."""
    import tvm

    spec = (spec or "llvm").strip()
    if spec == "llvm":
        return host_target()
    if spec == "cuda":
        # MetaSchedule's GPU rules need these limits; TVM fills them only from a present device.
        # Without one: the limits of every NVIDIA GPU since Maxwell (sm_50).
        config: Any = {"kind": "cuda", "host": host_target().export(), "arch": "sm_50", "max_threads_per_block": 1024,
                       "max_shared_memory_per_block": 49152, "thread_warp_size": 32, "registers_per_block": 65536}
        device = tvm.cuda()
        if device.exist:
            config.update(arch="sm_" + device.compute_version.replace(".", ""),
                          max_threads_per_block=device.max_threads_per_block,
                          max_shared_memory_per_block=device.max_shared_memory_per_block,
                          thread_warp_size=device.warp_size)
        return _make_target(config, spec)
    if spec.startswith("{"):
        try:
            config = json.loads(spec)
        except json.JSONDecodeError as error:
            raise UsageError(f"--target: not valid JSON ({error})") from None
        if not isinstance(config, dict) or "kind" not in config:
            raise UsageError('--target: a JSON target must be an object with a "kind", '
                             'e.g. {"kind": "llvm", "mcpu": "znver3"}')
        return _make_target(config, spec)
    if spec.isidentifier():
        return _make_target({"kind": spec}, spec)
    if "/" in spec:  # a TVM target tag such as nvidia/nvidia-a100
        try:
            return tvm.target.Target(spec, host=host_target())
        except Exception as error:
            raise UsageError(f"--target {spec}: {first_line(error)}") from None
    raise UsageError(f'--target {spec!r}: use llvm, cuda, a TVM tag such as nvidia/nvidia-a100 or a JSON dict such as '
                     '\'{"kind": "llvm", "mcpu": "haswell"}\'')


def _make_target(config: dict, spec: str) -> Any:
    import tvm
    from tvm.target import codegen

    try:
        target = tvm.target.Target(config)
    except Exception as error:  # TVM raises ValueError/TVMError with multi-line text
        raise UsageError(f"--target {spec}: {first_line(error)}") from None
    if target.kind.name == "llvm" and "mcpu" in config:
        triple = config.get("mtriple") or str(codegen.llvm_get_system_triple())
        if not codegen.llvm_is_valid_cpu(config["mcpu"], triple):
            raise UsageError(f"--target {spec}: LLVM does not know the CPU '{config['mcpu']}' for {triple}")
    return target


def data_caches() -> dict[int, tuple[int, int, int]]:
    """This machine's data (and unified) caches as seen by one core, from sysfs: level -> (bytes, ways, line bytes);
    ways and line are 0 where sysfs does not say."""
    caches: dict[int, tuple[int, int, int]] = {}
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return caches

    def read(entry: str, name: str, default: str | None = None) -> str:
        try:
            with open(f"{base}/{entry}/{name}") as f:
                return f.read().strip()
        except OSError:
            if default is None:
                raise
            return default

    for entry in entries:
        try:
            level, kind, size = read(entry, "level"), read(entry, "type"), read(entry, "size")
            multiplier = {"K": 1024, "M": 1024**2}.get(size[-1], 1)
            size_bytes = int(size.rstrip("KM")) * multiplier
            ways, line = int(read(entry, "ways_of_associativity", "0")), int(read(entry, "coherency_line_size", "0"))
        except (OSError, ValueError):
            continue
        if kind != "Instruction":
            caches[int(level)] = (size_bytes, ways, line)
    return caches


def _cache_sizes() -> dict[str, int]:
    return {f"l{level}_bytes": size for level, (size, _, _) in data_caches().items()}


def device_descriptor(target: Any) -> dict[str, Any]:
    """The device a target runs on when it is measured on this machine, for records and for cost models
    that generalise across devices.

    CPU: model string, vendor, mcpu (the ISA level LLVM compiles for), vector width in bits, cores
    used, cache sizes, clock. CUDA: GPU name, SMs, clock, memory, L2, when a GPU is here.
    """
    import tvm

    kind = target.kind.name
    if kind == "llvm":
        from tvm.target import codegen

        return cpu_descriptor(str(target.attrs.get("mcpu", "")), int(target.attrs.get("num-cores", physical_cores())),
                              set(codegen.llvm_get_cpu_features(target)))
    if kind == "cuda":
        return gpu_descriptor(kind, str(target.attrs.get("arch", "")), tvm.cuda())
    return {"kind": kind}


def cpu_descriptor(mcpu: str, cores: int, features: set[str]) -> dict[str, Any]:
    """This machine's CPU used with ``mcpu``'s ``features`` (LLVM's names; /proc/cpuinfo's flags name the vector
    ones alike) on ``cores`` threads: device_descriptor's, and a runtime-only batch runner's, without LLVM."""
    cpuinfo = _cpuinfo()
    desc: dict[str, Any] = {"kind": "llvm", "cpu": cpuinfo.get("model name", ""),
                            "vendor": cpuinfo.get("vendor_id", ""),
                            # the model string can be generic on a VM ("AMD EPYC" for Zen 1 and Zen 3); these are not
                            "family_model": f"{cpuinfo.get('cpu family', '')}/{cpuinfo.get('model', '')}",
                            "mcpu": mcpu, "cores": cores,
                            "vector_bits": 512 if "avx512f" in features else 256 if features & {"avx2", "avx"} else 128,
                            "fma": "fma" in features, **_cache_sizes()}
    clock = _max_clock_mhz() or cpuinfo.get("cpu MHz")
    if clock:
        desc["clock_mhz"] = float(clock)
    return desc


def gpu_descriptor(kind: str, arch: str, dev: Any, *, remote: bool = False) -> dict[str, Any]:
    """The GPU ``dev`` (here, or an RPC session's) used with code compiled for ``arch``, as TVM's runtime tells it:
    device_descriptor's, a runtime-only batch runner's, and a plain RPC server's (``remote``: its L2 size cannot be
    read from here). Without the device, the kind and arch alone."""
    desc: dict[str, Any] = {"kind": kind, "arch": arch}
    if not dev.exist:
        return desc
    desc.update(gpu=dev.device_name, sm_count=dev.multi_processor_count, clock_mhz=dev.max_clock_rate / 1000,
                memory_bytes=dev.total_global_memory, max_shared_memory_per_block=dev.max_shared_memory_per_block,
                warp_size=dev.warp_size)
    if kind == "cuda" and not remote:
        desc["l2_bytes"] = _cuda_l2_bytes()
    return desc


# What makes two descriptions the same device: a fixed list, so that describing more (a new key, a
# clock, an L2 size the CUDA runtime did or did not report) never changes the id of a device.
_IDENTITY_KEYS = ("kind", "cpu", "vendor", "family_model", "mcpu", "cores", "arch", "gpu", "sm_count", "memory_bytes")


def device_identity(description: dict[str, Any]) -> dict[str, Any]:
    """What of a device's description makes it that device: the same CPU or GPU model used the same way."""
    return {k: description[k] for k in _IDENTITY_KEYS if k in description}


def device_id(description: dict[str, Any]) -> str:
    """A short stable id of a device: equal for the same CPU or GPU model used the same way (mcpu, cores)."""
    import hashlib

    return hashlib.sha256(json.dumps(device_identity(description), sort_keys=True).encode()).hexdigest()[:16]


def _max_clock_mhz() -> float | None:
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") as f:
            return int(f.read().strip()) / 1000
    except (OSError, ValueError):
        return None


def _cuda_l2_bytes() -> int | None:
    """L2 size of GPU 0 from the CUDA runtime, if it can be loaded (TVM's device API does not report it)."""
    import ctypes

    try:
        cudart = ctypes.CDLL("libcudart.so")
    except OSError:
        return None
    value = ctypes.c_int()
    cuda_dev_attr_l2_cache_size = 38
    if cudart.cudaDeviceGetAttribute(ctypes.byref(value), cuda_dev_attr_l2_cache_size, 0) != 0:
        return None
    return value.value


# The tensor-intrinsic modules a target's schedule rules may refer to. Importing the whole
# tvm.s_tir.tensor_intrin package costs ~37 s here (mostly CUDA intrinsics); one module costs < 1 s.
_INTRINSICS_BY_KIND = {
    "llvm": {"x86_64": "x86", "i386": "x86", "aarch64": "arm_cpu", "arm": "arm_cpu", "riscv64": "riscv_cpu"},
    "cuda": "cuda",
    "rocm": "rocm",
    "metal": "metal",
    "hexagon": "hexagon",
}


def load_tensor_intrinsics(target: tvm.target.Target) -> None:
    """Register the tensor intrinsics ``target`` can use, and only those.

    TuneContext imports ``tvm.s_tir.tensor_intrin`` (every intrinsic of every backend) on
    construction; a package stub with the real path makes that import free and lets each
    submodule be imported on its own.
    """
    import tvm.s_tir

    package = "tvm.s_tir.tensor_intrin"
    if package not in sys.modules:
        stub = types.ModuleType(package)
        stub.__path__ = [os.path.join(os.path.dirname(tvm.s_tir.__file__), "tensor_intrin")]
        stub.__package__ = package
        sys.modules[package] = stub
    entry = _INTRINSICS_BY_KIND.get(target.kind.name)
    if isinstance(entry, dict):
        triple = str(target.attrs.get("mtriple", "")) or _host_triple()
        entry = entry.get(triple.split("-")[0])
    if entry:
        with _frames_of_no_file_have_no_module():
            importlib.import_module(f"{package}.{entry}")


@contextlib.contextmanager
def _frames_of_no_file_have_no_module() -> Iterator[None]:
    """TVMScript's ``T.prim_func`` takes ``inspect.stack()``, which asks ``inspect.getmodule`` for each frame's
    module; for a frame of code without a file ("<ast>": TVMScript's own evaluator, "<frozen importlib._bootstrap>")
    that walks all of ``sys.modules`` to answer None: 12 of the 15.5 s the CUDA intrinsics took to import, up to 1 s
    of the x86 ones (more, the deeper the stack) in every process that tunes. The answer is None without the walk."""
    import inspect

    walk = inspect.getmodule

    def getmodule(obj: Any, _filename: str | None = None) -> Any:
        if inspect.isframe(obj) and (_filename or obj.f_code.co_filename).startswith("<"):
            return None
        return walk(obj, _filename)

    inspect.getmodule = getmodule
    try:
        yield
    finally:
        inspect.getmodule = walk


def _host_triple() -> str:
    from tvm.target import codegen

    return str(codegen.llvm_get_system_triple())


def foreign_architecture(target: Any) -> str | None:
    """The architecture of an LLVM target whose ``mtriple`` is not this machine's (e.g. aarch64), else None."""
    triple = str(target.attrs.get("mtriple", "")) if target.kind.name == "llvm" else ""
    arch = triple.split("-")[0]
    return arch if arch and arch != _host_triple().split("-")[0] else None
