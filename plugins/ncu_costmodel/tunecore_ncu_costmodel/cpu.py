"""The CPU profiler: what Nsight Compute tells about a GPU kernel, told about a CPU kernel without hardware counters.

Two tools, neither of which touches Python or libtvm (valgrind on a Python+TVM process costs minutes per start):

- **callgrind** runs a small C harness (harness.c, built once per machine with the system C compiler) that
  loads the candidate's shared library and calls it: instructions, loads, stores, L1 and L2 misses (the cache
  geometry of this machine's cores, read from sysfs and passed explicitly: valgrind's own detection is wrong on
  VMs), branches and mispredicts. Only parallel task 0 of the target's cores runs: one core's share of the
  work with its private L1/L2, at half the cost. Counts are deterministic: the caches and branch predictor are
  simulated, so a device's profile can be made on any x86 machine that runs its code, with its L1/L2 sizes.
- **llvm-mca** estimates the steady-state throughput of the kernel's hot loop, found in the disassembly as the
  innermost loop with the most floating-point work (``objdump``), for the target's ``mcpu`` (or the nearest
  older CPU of its line that the installed llvm-mca knows).

AVX-512 code cannot run under valgrind (it stops at the first such instruction): a library that contains any
gets only the llvm-mca metrics and ``cpu.avx512 = 1``; its callgrind metrics are missing, not zero. Where the
programs' schedules are at hand (``tunecore ncu profile``), every program of a device with AVX-512 has its
**twin** counted instead, whether its own code uses AVX-512 or not, so that a task's programs are counted alike:
the same schedule built for the nearest CPU of the target's line without AVX-512 (``twin_target``: znver3 for
znver4 and znver5), whose callgrind counts (``cpu.twin = 1``; a twin that cannot be counted fails the row) stand for the
program's: the same loops, tiles and memory traffic, each 512-bit vector operation done as two 256-bit ones.
llvm-mca still reads the program's own code.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from typing import Any, Sequence

from tunecore.interfaces import UsageError
from tunecore.targets import cpu_lineage

# callgrind event -> metric; summed where two events make one metric
CALLGRIND_METRICS = {
    "cpu.instructions": ("Ir",),
    "cpu.loads": ("Dr",),
    "cpu.stores": ("Dw",),
    "cpu.l1_misses": ("D1mr", "D1mw"),
    "cpu.l2_misses": ("DLmr", "DLmw"),
    "cpu.branches": ("Bc", "Bi"),
    "cpu.mispredicts": ("Bcm", "Bim"),
    "cpu.icache_misses": ("I1mr",),
}
MCA_METRICS = ("mca.loop_cycles", "mca.loop_instructions", "mca.loop_flops", "mca.ipc", "mca.uops_per_cycle")
# how this candidate was profiled, and at what cost: not features. ``cpu.warm = 1`` marks a profile made by an
# earlier version, which warmed the caches of fast kernels only: its counts depend on the latency the model is
# asked to predict, so ``tunecore ncu profile`` makes such profiles again.
BOOKKEEPING = ("cpu.warm", "cpu.avx512", "cpu.twin", "cpu.profile_secs")

_PACKAGES = {"valgrind": "valgrind", "llvm-mca": "llvm", "objdump": "binutils", "cc": "gcc"}


def require(tool: str) -> str:
    """The path of a tool the profiler needs, or one line naming the package that installs it."""
    path = shutil.which(tool)
    if path is None:
        raise UsageError(f"the CPU profiler needs '{tool}', which is not installed: "
                         f"apt-get install {_PACKAGES.get(tool, tool)}")
    return path


@functools.lru_cache(maxsize=None)
def harness() -> str:
    """The harness executable, compiled on first use into the user's cache directory (keyed by its source)."""
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness.c")
    with open(source, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tunecore")
    path = os.path.join(cache, f"ncu-harness-{digest}")
    if not os.path.exists(path):
        os.makedirs(cache, exist_ok=True)
        temporary = f"{path}.{os.getpid()}"
        compiled = subprocess.run([require("cc"), "-O2", "-rdynamic", "-o", temporary, source, "-ldl"],
                                  capture_output=True, text=True)
        if compiled.returncode != 0:
            raise RuntimeError(f"cannot compile the profiling harness: {compiled.stderr.strip()[:500]}")
        os.replace(temporary, path)
    return path


def tensor_specs(args_info: Sequence) -> list[str]:
    """The harness's arguments for MetaSchedule ArgInfo JSON: ``float32:1x3x224x224``."""
    specs = []
    for kind, dtype, shape in args_info:
        if kind != "TENSOR":
            raise ValueError(f"cannot profile an argument of kind {kind}")
        specs.append(f"{dtype}:{'x'.join(str(int(d)) for d in shape)}")
    return specs


@functools.lru_cache(maxsize=None)
def cache_geometry(l1_bytes: int | None = None, l2_bytes: int | None = None) -> dict[str, tuple[int, int, int]]:
    """(size, ways, line) of the L1 data cache and the L2 per core to simulate, in valgrind's terms (its sets must
    be a power of two: a size that gives others is rounded down to one that does). Sizes are the device's where
    given (a profile for a device that is not this machine), else this machine's; ways and line are this
    machine's (8 and 64 where sysfs does not say)."""
    from tunecore.targets import data_caches

    here = data_caches()
    found: dict[str, tuple[int, int, int]] = {}
    for level, size, default in ((1, l1_bytes, 32768), (2, l2_bytes, 524288)):
        own_size, ways, line = here.get(level, (default, 0, 0))
        ways, line, size = ways or 8, line or 64, size or own_size
        sets = max(1, size // (ways * line))
        sets = 1 << (sets.bit_length() - 1)
        found[f"L{level}"] = (sets * ways * line, ways, line)
    return found


def callgrind(library: str, entry: str, threads: int, args_info: Sequence, *, caches: dict,
              timeout: float) -> dict[str, float]:
    """Callgrind's counts for one cold call of the kernel (task 0 of ``threads``), as metrics."""
    l1, l2 = caches["L1"], caches["L2"]
    with tempfile.TemporaryDirectory(prefix="tunecore-profile-") as directory:
        out = os.path.join(directory, "callgrind.out")
        # --vex-guest-max-insns: a block of unrolled AVX2 masked stores (vmaskmovps), each 8 guarded stores with
        # cache-simulation calls, overflows valgrind 3.19's translation buffer at the default 60 instructions
        # (it aborts: "Assertion 'tres.status == VexTransOK'"); at 30 it translates, with the same counts.
        command = [require("valgrind"), "--tool=callgrind", "--vex-guest-max-insns=30", "--cache-sim=yes",
                   "--branch-sim=yes",
                   "--simulate-hwpref=yes", "--D1={},{},{}".format(*l1), "--LL={},{},{}".format(*l2),
                   "--collect-atstart=no", "--toggle-collect=profiled_call", f"--callgrind-out-file={out}",
                   harness(), library, entry, str(threads), "profile",
                   *tensor_specs(args_info)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            lines = [x for x in done.stderr.splitlines()
                     if x.startswith(("harness:", "valgrind:")) or "unhandled instruction" in x]
            raise RuntimeError(lines[-1] if lines else f"valgrind exited with {done.returncode}")
        events, totals = [], []
        with open(out) as f:
            for line in f:
                if line.startswith("events:"):
                    events = line.split()[1:]
                elif line.startswith("totals:"):
                    totals = [float(x) for x in line.split()[1:]]
    counts = dict(zip(events, totals))
    return {metric: sum(counts.get(e, 0.0) for e in names) for metric, names in CALLGRIND_METRICS.items()}


# --- llvm-mca on the hot loop ---

_INSTRUCTION = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$")
_FLOPS_PER_LANE = (("vfmadd", 2), ("vfmsub", 2), ("vfnmadd", 2), ("vfnmsub", 2), ("vmul", 1), ("vadd", 1),
                   ("vsub", 1), ("vmax", 1), ("vmin", 1), ("vdiv", 1), ("mulss", 1), ("addss", 1), ("mulsd", 1),
                   ("addsd", 1))
_REGISTER_BITS = (("%zmm", 512), ("%ymm", 256), ("%xmm", 128))


def disassemble(library: str) -> list[tuple[int, str, str]]:
    """(address, mnemonic, operands) of every instruction in the library's text section."""
    done = subprocess.run([require("objdump"), "-d", "--no-show-raw-insn", "-M", "att", "-j", ".text", library],
                          capture_output=True, text=True, check=True)
    out = []
    for line in done.stdout.splitlines():
        match = _INSTRUCTION.match(line)
        if match:
            out.append((int(match.group(1), 16), match.group(2), match.group(3).split("#")[0].strip()))
    return out


_AVX512_OPERANDS = re.compile(r"%zmm|%k[0-7]\b|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|\{1to")
# an instruction line of objdump whose first byte after address and segment prefixes is 0x62: EVEX (AVX-512) in
# 64-bit code, where the instruction 0x62 was (BOUND) does not exist; with its mnemonic, not a continuation line
_EVEX_LINE = re.compile(r"^ *[0-9a-f]+:\t(?:(?:26|2e|36|3e|64|65|67) )*62 (?:[0-9a-f]{2} )*[ ]*\t\S", re.M)


def uses_avx512(instructions: Sequence[tuple[int, str, str]]) -> bool:
    """Whether the disassembly names AVX-512 state: zmm, mask or 16-31 vector registers, embedded broadcasts."""
    return any(_AVX512_OPERANDS.search(ops) for _, _, ops in instructions)


def evex_encoded(library: str) -> bool:
    """Whether the library holds any EVEX-encoded instruction, which valgrind cannot run: also AVX-512VL code on
    xmm/ymm registers 0-15 (vpternlogd, vpermt2ps, ...), which names no AVX-512 state."""
    done = subprocess.run([require("objdump"), "-d", "-j", ".text", library], capture_output=True, text=True,
                          check=True)
    return has_evex_line(done.stdout)


def has_evex_line(objdump_text: str) -> bool:
    """Whether ``objdump -d`` output (raw bytes shown) has an instruction whose first byte past its segment and
    address-size prefixes is 0x62; continuation lines of long instructions carry no mnemonic and do not count."""
    return bool(_EVEX_LINE.search(objdump_text))


def _flops(mnemonic: str, operands: str) -> float:
    for prefix, per_lane in _FLOPS_PER_LANE:
        if mnemonic.startswith(prefix):
            if mnemonic.endswith(("ss", "sd")):
                return per_lane
            bits = next((b for reg, b in _REGISTER_BITS if reg in operands), 128)
            return per_lane * bits // (64 if mnemonic.endswith("pd") else 32)
    return 0.0


def hot_loop(instructions: Sequence[tuple[int, str, str]]) -> list[tuple[str, str]] | None:
    """The innermost loop (a backward branch with no other loop inside) with the most floating-point work
    per iteration; the longest innermost loop when none computes. None when the code has no loop."""
    loops = []
    for i, (address, mnemonic, operands) in enumerate(instructions):
        match = re.match(r"([0-9a-f]+)\b", operands)
        if mnemonic.startswith("j") and match and int(match.group(1), 16) <= address:
            loops.append((int(match.group(1), 16), address, i))
    innermost = [(s, e, i) for s, e, i in loops if not any(s <= s2 and e2 <= e and (s2, e2) != (s, e)
                                                           for s2, e2, _ in loops)]
    best, best_key = None, None
    for start, _, end_index in innermost:
        body = [(m, ops) for a, m, ops in instructions[:end_index + 1] if a >= start]
        key = (sum(_flops(m, ops) for m, ops in body), len(body))
        if best_key is None or key > best_key:
            best, best_key = body, key
    return best


# A CPU newer than the installed llvm-mca (Debian 12's LLVM 14 has no znver4) is estimated with the newest
# model of its line that llvm-mca knows (the closest scheduling model it has) and that can run the code.
_WITHOUT_AVX512 = {"znver3", "znver2", "znver1", "alderlake", "skylake"}


def twin_target(target_json: str) -> str:
    """The llvm target whose code valgrind runs in place of AVX-512 code built for ``target_json``: the same target
    with the nearest CPU of its line without AVX-512 (a generic AVX2 x86-64 where the line has none), and no
    AVX-512 feature in its ``mattr``."""
    target = json.loads(target_json)
    target["mcpu"] = next((c for c in cpu_lineage(target.get("mcpu", "")) if c in _WITHOUT_AVX512), "x86-64-v3")
    if target.get("mattr"):
        target["mattr"] = [f for f in target["mattr"] if "avx512" not in f] + ["-avx512f"]
    return json.dumps(target, sort_keys=True)


@functools.lru_cache(maxsize=None)
def mca_cpu(mcpu: str, avx512: bool = False) -> str:
    """The processor to give llvm-mca for code built for ``mcpu``: itself when llvm-mca knows it, else its
    nearest predecessor that llvm-mca knows (with AVX-512 when the code uses it), else a generic x86-64."""
    if not mcpu:
        return "native"
    listing = subprocess.run([require("llvm-mca"), "-mtriple=x86_64-unknown-linux-gnu", "-mcpu=help"],
                             input="", capture_output=True, text=True, timeout=30)
    known = {line.split()[0] for line in (listing.stdout + listing.stderr).splitlines() if line.startswith("  ")}
    usable = (c for c in cpu_lineage(mcpu) if c in known and not (avx512 and c in _WITHOUT_AVX512))
    return next(usable, "x86-64-v4" if avx512 else "x86-64")


def mca(instructions: Sequence[tuple[int, str, str]], mcpu: str, avx512: bool,
        timeout: float = 30.0) -> dict[str, float]:
    """llvm-mca's steady-state estimate of the hot loop (see ``hot_loop``), on a CPU model that runs AVX-512 where
    the code has it; {} when the code has no loop."""
    body = hot_loop(instructions)
    if not body:
        return {}
    lines = ["loop:"]
    for mnemonic, operands in body:
        if mnemonic.startswith("j"):
            operands = "loop"  # branch targets are addresses in the library; llvm-mca needs a label
        lines.append(f"  {mnemonic} {operands}")
    command = [require("llvm-mca"), "-mtriple=x86_64-unknown-linux-gnu",
               f"-mcpu={mca_cpu(mcpu, avx512)}", "--json", "-iterations=100"]
    done = subprocess.run(command, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"llvm-mca: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'failed'}")
    summary = json.loads(done.stdout)["CodeRegions"][0]["SummaryView"]
    return {"mca.loop_cycles": float(summary["BlockRThroughput"]),
            "mca.loop_instructions": float(len(body)),
            "mca.loop_flops": float(sum(_flops(m, ops) for m, ops in body)),
            "mca.ipc": float(summary["IPC"]),
            "mca.uops_per_cycle": float(summary["uOpsPerCycle"])}


def profile_library(library: str, args_info: Sequence, *, threads: int, mcpu: str, caches: dict | None = None,
                    entry: str = "main", timeout: float = 60.0, twin: str | None = None) -> dict[str, float]:
    """Every CPU metric of one built kernel (see the module docstring); raises when it cannot be profiled.

    Every kernel is profiled the same way, one cold call, whatever its latency: a warm-up call for fast kernels
    only made the counts tell fast programs from slow ones by how they were profiled. ``caches`` is
    ``cache_geometry``'s answer for the device (this machine's by default). ``twin``: the library of the same
    schedule built for ``twin_target``, whose callgrind counts are taken instead of the kernel's own ('' when it
    did not build: the kernel cannot be profiled like its task's other programs, so it raises)."""
    started = time.perf_counter()
    instructions = disassemble(library)
    avx512 = uses_avx512(instructions) or evex_encoded(library)
    metrics = mca(instructions, mcpu, avx512)
    if avx512:
        metrics["cpu.avx512"] = 1.0
    caches = caches or cache_geometry()
    if twin is None and not avx512:
        metrics.update(callgrind(library, entry, threads, args_info, caches=caches, timeout=timeout))
    elif twin is not None:
        if not twin:
            raise RuntimeError("its twin (the schedule built without AVX-512) did not build")
        metrics.update(callgrind(twin, entry, threads, args_info, caches=caches, timeout=timeout))
        metrics["cpu.twin"] = 1.0
    metrics["cpu.profile_secs"] = time.perf_counter() - started
    return metrics


def check_tools() -> None:
    """One line naming the package to install when a tool is missing (before any work starts)."""
    for tool in ("valgrind", "llvm-mca", "objdump", "cc"):
        require(tool)


def target_facts(target_json: str) -> tuple[int, str]:
    """(cores, mcpu) of an llvm target in JSON."""
    from tunecore.targets import physical_cores

    target: dict[str, Any] = json.loads(target_json)
    return int(target.get("num-cores") or physical_cores()), str(target.get("mcpu", ""))
