"""The ``dask`` builder: candidates built as tasks on a Dask distributed cluster.

    tunecore run ... -O measurer.builder=dask [-O measurer.scheduler=tcp://HOST:8786]

Without a scheduler address it starts a LocalCluster on 127.0.0.1 (one single-threaded worker process per
core). A task carries plain JSON (the scheduled module, the target) and returns the built library as bytes,
so only tunecore and TVM at the same versions are needed on the workers. On a worker every build runs in a
warm child process with a timeout (TVM's popen pool, as the local builder does): a build that crashes or
hangs kills that child, not the Dask worker, and comes back as a failed build. A worker that dies is
Dask's business: its tasks are run again on another worker.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import tempfile
import uuid
from typing import Any, Sequence

from tunecore.errors import MeasurerUnavailable, UsageError, error_line
from tunecore.roles import Artifact, Builder

_pools: dict[tuple[str, float], Any] = {}  # on a Dask worker: warm build processes per (target, timeout)


def build_on_worker(mod_json: str, target_json: str, timeout: float, export: str,
                    cross_compiler: str | None) -> tuple[bytes, float, list, dict | None] | str:
    """A Dask task: (the library's bytes, build seconds, its arguments, its packing), or why it failed as one
    line."""
    from tvm.support.popen_pool import PopenPoolExecutor

    from tunecore.measure import worker
    from tunecore.measure.local import describe_failure, keep_torch_out

    pool = _pools.get((target_json, timeout))
    if pool is None:
        import distributed

        keep_torch_out()
        threads = getattr(distributed.get_worker(), "nthreads", 1)  # builds this Dask worker runs at once
        pool = _pools[(target_json, timeout)] = PopenPoolExecutor(
            threads, timeout=timeout, initializer=worker.init_worker, initargs=(target_json,))
    directory = tempfile.mkdtemp(prefix="tunecore-dask-build-")
    try:
        path, seconds, args, packing = pool.submit(worker.build, mod_json, target_json, directory, export,
                                                   cross_compiler).result()
        with open(path, "rb") as f:
            return f.read(), seconds, args, packing
    except Exception as error:
        return "build: " + describe_failure(error, timeout)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class DaskBuilder(Builder):
    """Builds on a Dask cluster (see the module docstring)."""

    name = "dask"

    def __init__(self, target: Any, *, scheduler: str | None = None, build_timeout: float = 60.0,
                 build_workers: int | None = None, export: str = "so", cross_compiler: str | None = None,
                 **options: Any):
        super().__init__(target, **options)
        from tunecore.measure.local import check_export
        from tunecore.targets import physical_cores
        from tunecore.tvmjson import target_to_json

        try:
            import distributed
        except ImportError:
            raise UsageError("the dask builder needs dask distributed: bash install.sh, or pip install "
                             "'tunecore[fleet]'") from None
        check_export(target, export, cross_compiler)
        self.export, self.cross_compiler, self.timeout = export, cross_compiler, float(build_timeout)
        self.target_json = target_to_json(target)
        self.directory = tempfile.mkdtemp(prefix="tunecore-build-")
        self.cluster = None
        if scheduler:
            try:
                self.client = distributed.Client(scheduler, timeout=10)
            except (OSError, TimeoutError) as error:
                raise UsageError(f"cannot reach the Dask scheduler at {scheduler}: {error_line(error)}") from None
        else:
            # host: with none, distributed probes a public address to find its own (dask/distributed#8559)
            self.cluster = distributed.LocalCluster(n_workers=build_workers or physical_cores(), threads_per_worker=1,
                                                    processes=True, host="127.0.0.1", dashboard_address=None)
            self.client = distributed.Client(self.cluster)
        self.capacity = max(1, sum(w.get("nthreads", 1) for w in self.client.scheduler_info()["workers"].values()))

    def build(self, mods_json: Sequence[str]) -> list[Artifact | str]:
        import distributed

        futures = [self.client.submit(build_on_worker, mod_json, self.target_json, self.timeout, self.export,
                                      self.cross_compiler, pure=False, retries=1) for mod_json in mods_json]
        out: list[Artifact | str] = []
        for future in futures:
            try:
                built = future.result()
            except distributed.KilledWorker:
                out.append("build: it killed every Dask worker that tried it")
                continue
            except (OSError, TimeoutError, concurrent.futures.CancelledError) as error:
                raise MeasurerUnavailable(f"the Dask cluster went away: {error_line(error)}") from None
            except Exception as error:  # this build's task failed on its worker
                out.append("build: dask: " + error_line(error))
                continue
            if isinstance(built, str):
                out.append(built)
                continue
            library, seconds, args, packing = built
            path = os.path.join(self.directory, f"{uuid.uuid4().hex}.{self.export}")
            with open(path, "wb") as f:
                f.write(library)
            out.append(Artifact(path, seconds, args, packing))
        return out

    def close(self) -> None:
        try:
            self.client.close()
            if self.cluster is not None:
                self.cluster.close()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)
