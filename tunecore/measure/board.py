"""What runs on a board: ``tunecore fleet server``, TVM's RPC server registered with a tracker under a key, kept
serving through kernel crashes, and answering the runner's question for the device's identity
(``rpc.DESCRIBE_FUNCTION``). The runner that uses such boards is tunecore.measure.rpc."""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from tunecore.errors import MeasurerUnavailable
from tunecore.measure.rpc import DESCRIBE_FUNCTION, Tracker


def register_device_functions() -> None:
    """On an RPC server (``tunecore fleet server``): let the runner read this device's identity."""
    import tvm_ffi

    @tvm_ffi.register_global_func(DESCRIBE_FUNCTION, override=True)
    def describe(target_json: str) -> str:
        from tunecore.targets import device_descriptor
        from tunecore.tvmjson import target_from_json

        return json.dumps(device_descriptor(target_from_json(target_json)))


# TVM's server registers again with a restarted tracker within its retry period (5 s): a server unlisted for
# longer than that, under load too, has stopped serving
_UNLISTED_S = 8.0


def _start_server(server_class: Any, **options: Any) -> Any:
    """TVM's server, trying for 30 s while its port is still held (by the server just stopped)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return server_class(**options)
        except (OSError, ValueError):  # ValueError: "cannot bind to any port"
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def serve(tracker: tuple[str, int], key: str, host: str, port: int, port_end: int,
          say: Callable[[str], None] = print) -> None:
    """Run TVM's RPC server for ``key`` until interrupted, starting it again whenever it stops serving: when a
    kernel crashes a session, TVM's server stops listening (its process lives on), and a board must not leave
    the fleet for that. It has stopped when the tracker no longer lists it for a few seconds."""
    import psutil
    from tvm.rpc.server import Server

    from tunecore.targets import host_target, use_target_threads

    use_target_threads(host_target())  # the sessions' thread pools can use every core; each run narrows its own
    registry = Tracker(tracker)
    try:
        while True:
            server = _start_server(Server, host=host, port=port, port_end=port_end, tracker_addr=tracker, key=key,
                                   silent=True, server_init_callback=register_device_functions)
            say(f"rpc server for key '{key}' on {host}:{server.port}, registered with the tracker at "
                f"{tracker[0]}:{tracker[1]}")
            missing_since: float | None = time.monotonic()  # until it is listed for the first time
            while server.proc.is_alive():
                time.sleep(0.5)
                try:
                    listed = server.port in [p for _, p in registry.servers(key)]
                except MeasurerUnavailable:  # the tracker is down: nothing to judge by
                    listed = True
                if listed:
                    missing_since = None
                elif missing_since is None:
                    missing_since = time.monotonic()
                elif time.monotonic() - missing_since > _UNLISTED_S:
                    break
            server.terminate()
            say("rpc server stopped serving (a kernel crashed its session?); starting it again")
    finally:  # TVM's server and its session processes must not outlive this command
        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
