"""The dask builder on a real LocalCluster: builds come back as bytes; a build that crashes and a worker that
dies mid-build cost at most that build, never the run."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest
import tvm

from tunecore.measure.dask_builder import DaskBuilder
from tunecore.roles import Artifact
from tunecore.testing import sample_candidates, tiny_task


@pytest.fixture(scope="module")
def builder(target):
    builder = DaskBuilder(target, build_workers=2)
    yield builder
    builder.close()


def _modules(op: str, n: int) -> list[str]:
    return [tvm.ir.save_json(c.mod) for c in sample_candidates(tiny_task(op), n)]


def _build_children(builder) -> list[psutil.Process]:
    """The processes the Dask workers build in (TVM popen workers)."""
    pids = builder.client.run(os.getpid).values()
    return [child for pid in pids for child in psutil.Process(pid).children(recursive=True)
            if "popen_worker" in " ".join(child.cmdline())]


def test_builds_run_on_the_workers_and_come_back_as_libraries(builder, matmul_task):
    built = builder.build(_modules("matmul-64", 4))
    assert all(isinstance(a, Artifact) and os.path.getsize(a.path) > 1000 and a.args for a in built), built
    assert builder.capacity == 2
    for artifact in built:
        builder.discard(artifact)
    assert os.listdir(builder.directory) == []


def test_a_build_that_crashes_is_a_failed_build_and_the_worker_lives_on(builder):
    workers = dict(builder.client.run(os.getpid))
    builder.build(_modules("matmul-64", 2))  # the build processes exist from now on
    stop = threading.Event()

    def crash_builds() -> None:
        while not stop.is_set():
            for child in _build_children(builder):
                try:
                    child.send_signal(signal.SIGSEGV)
                except psutil.Error:
                    pass
            time.sleep(0.05)

    crasher = threading.Thread(target=crash_builds)
    crasher.start()
    try:
        crashed = builder.build(_modules("matmul-512", 4))
    finally:
        stop.set()
        crasher.join()
    assert any(isinstance(c, str) and "crashed" in c for c in crashed), crashed
    assert dict(builder.client.run(os.getpid)) == workers  # no Dask worker died for it
    after = builder.build(_modules("matmul-64", 4))
    assert all(isinstance(a, Artifact) for a in after), after


def test_a_worker_killed_mid_build_costs_no_build(target):
    builder = DaskBuilder(target, build_workers=2)
    try:
        builder.build(_modules("matmul-64", 2))
        victim = next(iter(builder.client.run(os.getpid).values()))
        killer = threading.Timer(0.5, os.kill, args=(victim, signal.SIGKILL))
        killer.start()
        built = builder.build(_modules("matmul-512", 6))
        killer.join()
        assert all(isinstance(a, Artifact) for a in built), built
        assert victim not in builder.client.run(os.getpid).values()  # the nanny started a new worker
    finally:
        builder.close()


def test_a_scheduler_that_is_not_there_is_one_line():
    from tunecore.errors import UsageError
    from tunecore.targets import host_target

    with pytest.raises(UsageError, match="cannot reach the Dask scheduler at tcp://127.0.0.1:1"):
        DaskBuilder(host_target(), scheduler="tcp://127.0.0.1:1")
