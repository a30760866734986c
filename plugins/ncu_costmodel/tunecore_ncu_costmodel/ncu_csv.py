"""Nsight Compute's CSV output, both layouts, into per-kernel metrics in base units.

- the default *details* page (``ncu --csv``): long, one row per kernel x section x metric, with columns
  "Metric Name", "Metric Unit", "Metric Value"; newer versions add rule columns, and rule rows have no metric;
- the *raw* page (``ncu --csv --page raw``, or ``ncu -i REPORT --csv --page raw``): wide, one row per kernel
  launch, one column per metric, and a second row with the units. ncu 2025.3 writes every rollup of each asked
  metric (.avg/.max/.min/.sum), all device__attribute_*, launch__* and profiler__* columns, asked for or not.

Both may be preceded by ``==PROF==`` lines and the profiled program's own output; values may carry thousands
separators ("1,215,000.00", or "1.215.000,00" in some locales) or be "n/a"; units auto-scale (us, Kbyte,
Gbyte/s; "usecond", "Gbyte/second" in older versions) unless ``--print-units base`` was given, and even then
the base unit of time is "ns". Each kernel is keyed by (ID, Kernel Name).
Checked against ncu 2025.3.1 on an H100 (tests/fixtures/real_h100_*.csv, scripts/capture_ncu_fixtures.py).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import re
import shutil

from tunecore.interfaces import UsageError

# The study's metric set (summerspringwei/tvm_oraa, ncu_metrics_utils.py), by group; what the profiler asks ncu for.
STUDY_METRICS = (
    # device attributes (normalise the others, as the study did with the SM count)
    "device__attribute_multiprocessor_count", "device__attribute_max_shared_memory_per_block",
    "device__attribute_l2_cache_size", "device__attribute_max_registers_per_block",
    "device__attribute_global_memory_bus_width", "device__attribute_max_threads_per_multiprocessor",
    # launch
    "launch__grid_size", "launch__block_size", "launch__registers_per_thread", "launch__shared_mem_per_block",
    "launch__waves_per_multiprocessor", "launch__occupancy_limit_blocks", "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem", "launch__occupancy_limit_warps",
    # loads and stores
    "dram__bytes_read.sum", "dram__bytes_write.sum", "dram__sectors_read.sum", "dram__sectors_write.sum",
    # the study's sass__inst_executed_{shared,global}_{loads,stores} are gone: ncu 2025.3 accepts the names but
    # reports "n/a" (details page) or leaves them out (raw page) on an H100; these count the same instructions
    "smsp__sass_inst_executed_op_shared_ld.sum", "smsp__sass_inst_executed_op_shared_st.sum",
    "smsp__inst_executed_op_ldsm.sum",
    "smsp__inst_executed_op_shared_atom.sum", "smsp__inst_executed_op_global_red.sum",
    # shared-memory bank conflicts
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_atom.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    # instructions and caches
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "smsp__sass_inst_executed_op_global_ld.sum",
    "smsp__sass_inst_executed_op_global_st.sum", "smsp__sass_inst_executed_op_memory_128b.sum",
    "smsp__sass_inst_executed_op_memory_16b.sum", "smsp__sass_inst_executed_op_memory_32b.sum",
    "smsp__sass_inst_executed_op_memory_64b.sum", "sm__sass_inst_executed_op_ldgsts_cache_bypass.sum",
    "lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum", "lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum",
    "smsp__inst_executed_op_branch.sum", "smsp__inst_executed.sum",
    # the label: kept in the profile, never a feature
    "gpu__time_duration.sum",
)

# prefix -> factor, for a unit's scaled forms (Kbyte, us, Gbyte/s, Mcycle, ...)
_PREFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TIME = ("second", "s")  # ncu 2025 writes "ns", "us", "Gbyte/s"; older versions "usecond", "Gbyte/second"
_BASE_UNITS = _TIME + ("byte", "cycle", "inst", "sector", "request", "warp", "block", "thread", "register",
                       "hz", "Hz", "wavefront", "pass")
_UNIT = re.compile(r"^(n|u|m|K|M|G|T)?(" + "|".join(_BASE_UNITS) + r")s?$")
_LONG_COLUMNS = ("Metric Name", "Metric Value")


@dataclasses.dataclass
class KernelProfile:
    id: str
    kernel: str
    metrics: dict[str, float]  # metric name -> value in base units; a metric ncu gave as "n/a" is absent


# how every profile is asked for: the raw page as CSV in base units, over the study's metrics; and the GPU's clocks
# left as they are (ncu locks them to base by default, a change to the machine's settings that a lent GPU forbids;
# timings are taken outside ncu anyway, and counters such as bytes and instructions do not depend on the clock)
COMMAND = ("--csv", "--page", "raw", "--print-units", "base", "--clock-control", "none",
           "--metrics", ",".join(STUDY_METRICS))


def check_tool() -> str:
    """The path of ``ncu``, or one line saying how to get it."""
    path = shutil.which("ncu")
    if path is None:
        raise UsageError("the CUDA profiler needs 'ncu' (Nsight Compute), which is not installed: it comes with "
                         "the CUDA toolkit (apt-get install nsight-compute, or NVIDIA's cuda-nsight-compute package)")
    return path


def number(text: str) -> float | None:
    """A value as ncu prints it: "1,215,000.50", "1.215.000,50", "12.5", "n/a" (None)."""
    text = text.strip().strip('"')
    if not text or text.lower() in ("n/a", "nan", "-"):
        return None
    if "," in text and "." in text:
        # the last separator is the decimal point
        text = text.replace(",", "") if text.rfind(".") > text.rfind(",") else text.replace(".", "").replace(",", ".")
    elif "," in text:
        # only commas: thousands separators (1,024) unless there is exactly one followed by other than 3 digits
        head, _, tail = text.rpartition(",")
        text = text.replace(",", "") if len(tail) == 3 else f"{head.replace(',', '')}.{tail}"
    elif text.count(".") > 1:
        text = text.replace(".", "")  # European thousands without decimals
    try:
        return float(text)
    except ValueError:
        return None


def to_base(value: float, unit: str) -> float:
    """A value in ``unit`` (auto-scaled by ncu) in its base unit (time in seconds, so ncu's base "ns" too);
    unknown units (%, SM, ratios) unchanged."""
    numerator, _, denominator = unit.strip().partition("/")
    match = _UNIT.match(numerator)
    if not match:
        return value
    factor = _PREFIX[match.group(1) or ""]
    per = _UNIT.match(denominator)
    if per and per.group(2) in _TIME:  # a rate: per scaled second; per block, per thread: the numerator alone
        factor /= _PREFIX[per.group(1) or ""]
    return value * factor


def parse(text: str) -> list[KernelProfile]:
    """Every kernel launch in ncu's CSV (either layout), in the order ncu listed them."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        raise ValueError("no ncu CSV header (a line starting with \"ID\") in the output")
    rows = list(csv.reader(io.StringIO("\n".join(line for line in lines[start:] if not line.startswith("==")))))
    header, body = rows[0], rows[1:]
    column = {name: i for i, name in enumerate(header)}
    for required in ("ID", "Kernel Name"):
        if required not in column:
            raise ValueError(f"ncu CSV without a '{required}' column")
    kernels: dict[tuple[str, str], KernelProfile] = {}

    def kernel(row: list[str]) -> KernelProfile:
        key = (row[column["ID"]], row[column["Kernel Name"]])
        return kernels.setdefault(key, KernelProfile(*key, {}))

    if all(name in column for name in _LONG_COLUMNS):
        unit_column = column.get("Metric Unit")
        width = max(column[name] for name in _LONG_COLUMNS) + 1
        for row in body:
            # metric rows stop after "Metric Value" when the header has rule columns (ncu 2025.3), so only as
            # wide as that column is needed
            if len(row) < width or not row[column["Metric Name"]]:
                continue  # a rule row, or a line the program printed
            value = number(row[column["Metric Value"]])
            profile = kernel(row)
            if value is not None:
                unit = row[unit_column] if unit_column is not None else ""
                profile.metrics[row[column["Metric Name"]]] = to_base(value, unit)
        return list(kernels.values())
    # the row after the header gives the units (it has no ID)
    units = body[0] if body and len(body[0]) == len(header) and not body[0][column["ID"]] else [""] * len(header)
    metric_columns = [i for i, name in enumerate(header) if "__" in name]  # raw metric names: unit__counter.rollup
    for row in body:
        if len(row) < len(header) or not row[column["ID"]]:
            continue  # the units row, or a line the program printed
        profile = kernel(row)
        for i in metric_columns:
            value = number(row[i])
            if value is not None:
                profile.metrics[header[i]] = to_base(value, units[i] if i < len(units) else "")
    return list(kernels.values())


def is_time_derived(metric: str) -> bool:
    """Whether a metric measures or divides by time (durations, rates, cycles, %-of-peak): it would leak the label."""
    lowered = metric.lower()
    return any(word in lowered for word in ("duration", "per_second", "pct", "peak_sustained", "throughput",
                                            "elapsed", "cycles", "time"))


def candidate_metrics(kernels: list[KernelProfile]) -> dict[str, float]:
    """One candidate's profile: its kernels' counts summed (a TVM function may launch several), launch and
    device attributes from the first, each under ``ncu.<metric>``. ncu's own bookkeeping (profiler__*: replay
    passes, bytes it saved and restored), which the raw page adds unasked, describes the profiling, not the
    program: left out."""
    out: dict[str, float] = {}
    for index, profile in enumerate(kernels):
        for name, value in profile.metrics.items():
            if name.startswith("profiler__"):
                continue
            key = f"ncu.{name}"
            if name.startswith(("launch__", "device__")):
                if index == 0:
                    out[key] = value
            else:
                out[key] = out.get(key, 0.0) + value
    out["ncu.kernels"] = float(len(kernels))
    return out
