"""Fuzzing every parser of user input for a bounded time: each input is understood, or refused with one clear line
(UsageError: the CLI prints it and exits 2); never another exception, never a hang (hypothesis' deadline).

Inputs: --target specs, -O options (parsed and handed to components), --store values, ONNX files, dataset files,
MetaSchedule JSON databases. Random and mutated-valid inputs both, so that the fuzzing reaches past the first
check of each parser. Budget: ``TUNECORE_FUZZ_EXAMPLES`` examples per parser (default 40).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tunecore.errors import UsageError

EXAMPLES = int(os.environ.get("TUNECORE_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=60_000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])

_json_scalars = (st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=True)
                 | st.text(max_size=20))
_json = st.recursive(_json_scalars, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)
_target_keys = st.sampled_from(["kind", "mcpu", "mtriple", "num-cores", "keys", "arch", "mattr", "host", "tag",
                                "max_num_threads", "libs"])
_target_dicts = st.dictionaries(_target_keys, _json | st.sampled_from(["llvm", "cuda", "c", "znver3", "x86_64"]),
                                max_size=5)


def _understood_or_one_line(call, *args, **kwargs):
    try:
        return call(*args, **kwargs)
    except UsageError as error:
        message = str(error)
        assert message and "\n" not in message.strip(), message
        return None


def _mutations(data: bytes) -> st.SearchStrategy:
    """``data`` cut short, with bytes overwritten, or with random bytes spliced in."""
    def mutate(edits: list[tuple[int, int]], cut: int, splice: bytes) -> bytes:
        out = bytearray(data)
        for position, value in edits:
            out[position % len(out)] = value
        out = out[: max(1, len(out) - cut)]
        middle = len(out) // 2
        return bytes(out[:middle] + splice + out[middle:])

    return st.builds(mutate, st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 255)), max_size=8),
                     st.integers(0, len(data)) | st.just(0), st.binary(max_size=16))


@FUZZ
@given(st.text(max_size=60) | _target_dicts.map(json.dumps))
def test_target_specs(spec):
    from tunecore.targets import resolve_target

    _understood_or_one_line(resolve_target, spec)


@FUZZ
@given(st.lists(st.text(max_size=30) | st.builds(
    lambda role, key, value: f"{role}.{key}={value}",
    st.sampled_from(["search", "cost_model", "measurer", "random", "none", "xgb", "nope"]),
    st.sampled_from(["population", "seed", "build_workers", "run_timeout", "repeat", "screen", "export", "key",
                     "tracker", "queue_timeout", "device_retries", "builder", "runner", "min_data", "x"]),
    st.text(max_size=8) | _json.map(json.dumps)), max_size=4))
def test_options_parsed_and_given_to_components(pairs):
    """-O values reach the constructors of the search policy, cost model and (without starting its processes)
    the measurer's parts."""
    from tunecore import api
    from tunecore.options import options_for, parse_options
    from tunecore.registry import Registry
    from tunecore.targets import host_target

    options = _understood_or_one_line(parse_options, pairs, ["random", "none", "xgb"])
    if options is None:
        return
    registry = Registry.shared()
    store = api.open_store("memory:")
    try:
        model = _understood_or_one_line(api._construct, registry, "cost_model", "none",
                                        **options_for(options, "cost_model", "none"))
        if model is not None:
            search = _understood_or_one_line(api._construct, registry, "search", "random", cost_model=model,
                                             store=store, **options_for(options, "search", "random"))
            if search is not None:
                search.close()
        measurer = options_for(options, "measurer", "local")
        _understood_or_one_line(_check_measurer_options, host_target(), measurer)
    finally:
        store.close()


def _check_measurer_options(target, options):
    """What LocalMeasurer checks before it starts any process: the parts named and their options' values."""
    from tunecore.measure.local import LocalMeasurer, _accepted
    from tunecore.options import reject_unknown_options
    from tunecore.registry import Registry

    registry = Registry.shared()
    builder = options.pop("builder", "local")
    runner = options.pop("runner", "local")
    if not isinstance(builder, str) or not isinstance(runner, str):
        raise UsageError("measurer.builder and measurer.runner are names")
    registry.check_target(target, builder=builder, runner=runner)
    taken = _accepted(registry.get("builder", builder), options).keys() | _accepted(
        registry.get("runner", runner), options).keys()
    try:
        reject_unknown_options("measurer", LocalMeasurer.name, {k: v for k, v in options.items() if k not in taken})
    except TypeError as error:  # as api._construct turns it into the CLI's one line
        raise UsageError(str(error)) from None


@FUZZ
@given(st.text(max_size=40) | st.builds(lambda scheme, rest: f"{scheme}:{rest}",
                                         st.sampled_from(["sqlite", "memory", "postgresql", "json", "nope"]),
                                         st.text(max_size=30)))
def test_store_values(tmp_path_factory, spec):
    from tunecore import api

    directory = tmp_path_factory.mktemp("stores")
    cwd = os.getcwd()
    os.chdir(directory)  # a fuzzed path lands here
    try:
        spec = spec.replace("postgresql:", "postgresql://nobody@127.0.0.1:1/")  # refused fast, never a real server
        store = _understood_or_one_line(api.open_store, spec, None)
        if store is not None:
            store.close()
    except (OSError, ValueError) as error:  # the file system refused the name (NUL byte, too long)
        assert "\x00" in spec or len(spec.encode()) > 255 or isinstance(error, OSError), error
    finally:
        os.chdir(cwd)


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory):
    from tunecore.testing.helpers import write_tiny_onnx

    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    write_tiny_onnx(str(path), size=8)
    return path.read_bytes()


@FUZZ
@given(data=st.data())
def test_onnx_files(tmp_path_factory, tiny_onnx, data):
    from tunecore.targets import host_target
    from tunecore.workloads import extract_tasks, load_workload

    content = data.draw(_mutations(tiny_onnx) | st.binary(max_size=200))
    path = tmp_path_factory.mktemp("fuzz") / "model.onnx"
    path.write_bytes(content)
    workload = _understood_or_one_line(load_workload, str(path))
    if workload is not None:
        _understood_or_one_line(extract_tasks, workload, host_target())


SHIPPED_DATASET = os.path.join(os.path.dirname(__file__), "..", "datasets", "cpu-programs.parquet")
with open(SHIPPED_DATASET, "rb") as _file:
    _SHIPPED_BYTES = _file.read()


@FUZZ
@given(data=st.data())
def test_dataset_files(tmp_path_factory, data):
    from tunecore.dataset.table import Dataset

    content = data.draw(_mutations(_SHIPPED_BYTES) | st.binary(max_size=200))
    path = tmp_path_factory.mktemp("fuzz") / "data.parquet"
    path.write_bytes(content)
    dataset = _understood_or_one_line(Dataset.load, str(path))
    if dataset is not None:
        dataset.info()


@pytest.fixture(scope="module")
def metaschedule_database(tmp_path_factory, matmul_task):
    """A real MetaSchedule JSON database (two records of the 64x64 matmul), as two files' contents."""
    from tunecore.data import Record
    from tunecore.store.metaschedule import export_metaschedule
    from tunecore.store.sqlite import MemoryStore
    from tunecore.testing import sample_candidates

    store = MemoryStore()
    store.put_tasks([matmul_task])
    store.commit([Record.from_result(c, _result(), trial=i) for i, c in enumerate(sample_candidates(matmul_task, 2))])
    directory = tmp_path_factory.mktemp("ms")
    export_metaschedule(store, str(directory), [matmul_task])
    return {name: (directory / name).read_bytes() for name in os.listdir(directory)}


def _result():
    from tunecore.data import MeasureResult

    return MeasureResult(run_secs=[1e-4])


@settings(FUZZ, max_examples=max(1, EXAMPLES // 5))  # TVM reads each database in a child process: 4.5 s each
@given(data=st.data())
def test_metaschedule_json_imports(tmp_path_factory, metaschedule_database, data):
    from tunecore.store.metaschedule import import_metaschedule
    from tunecore.store.sqlite import MemoryStore

    directory = tmp_path_factory.mktemp("fuzz")
    for name, content in metaschedule_database.items():
        lines = content.split(b"\n")
        line = data.draw(st.integers(0, max(0, len(lines) - 1)))
        lines[line] = data.draw(_mutations(lines[line] or b"{}") | _json.map(lambda v: json.dumps(v).encode()))
        (directory / name).write_bytes(b"\n".join(lines))
    store = MemoryStore()
    try:
        _understood_or_one_line(import_metaschedule, store, str(directory), None)
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def checking_measurer():
    from tunecore.measure.local import LocalMeasurer
    from tunecore.targets import host_target

    measurer = LocalMeasurer(host_target())
    yield measurer
    measurer.close()


@settings(FUZZ, max_examples=max(1, EXAMPLES // 4))  # one build and run each
@given(op=st.sampled_from(["matmul-64", "matmul-96x64x80", "c1d-0", "sfm-0"]), seed=st.integers(1, 1000),
       which=st.integers(0, 3), axis=st.sampled_from([0, -1]), factor=st.integers(2, 4))
def test_edited_traces_that_compute_something_else_are_never_a_success(checking_measurer, op, seed, which, axis,
                                                                       factor):
    """Random programs of a task, their traces edited to fold an axis of one input (tunecore.testing.helpers.
    wrong_schedule): the measurer reports each as a failure, a wrong output whenever it builds and runs."""
    from tunecore.data import Candidate
    from tunecore.testing.helpers import sample_candidates, tiny_task, wrong_schedule

    task = tiny_task(op)
    (good,) = sample_candidates(task, 1, seed=seed)
    sch = wrong_schedule(good.sch, which, axis, factor)
    if sch is None:
        return
    (result,) = checking_measurer.measure(task, [Candidate.from_schedule(task, sch, origin="wrong")])
    assert result.latency is None
    assert result.error.startswith(("wrong output: max relative error", "build:")), result.error
