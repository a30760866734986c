"""Real fleet processes for tests and benchmarks, on 127.0.0.1 only: a TVM RPC tracker and device servers
started with the documented commands (``tunecore fleet tracker`` / ``tunecore fleet server``), each in its own
process group so that a test can kill, stop or restart one like a board that dies; a throwaway PostgreSQL."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def start(*args: str, log: str | None = None) -> subprocess.Popen:
    """A ``tunecore`` command in its own process group, its output appended to the file ``log`` (or dropped)."""
    with open(log or os.devnull, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "tunecore.cli", *args], start_new_session=True,
                                stdout=out, stderr=subprocess.STDOUT)


def signal_group(process: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
    if sig == signal.SIGKILL:
        process.wait(timeout=30)


class Fleet:
    """A tracker and ``servers`` device servers under ``key``."""

    def __init__(self, key: str = "test", servers: int = 2):
        from tunecore.measure.rpc import Tracker

        self.key = key
        self.port = free_port()
        self.log_dir = tempfile.mkdtemp(prefix="tunecore-fleet-")  # what the processes said, for a failing test
        self.tracker_process = start("fleet", "tracker", "--port", str(self.port), log=self._log("tracker"))
        self.tracker = Tracker(("127.0.0.1", self.port))
        self.servers: list[subprocess.Popen] = []
        self.server_ports: list[int] = []
        self.keys: list[str] = []
        for _ in range(servers):
            self.add_server()
        self.wait_for(servers)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def options(self, **more: object) -> dict:
        return {"runner": "rpc", "tracker": self.address, "key": self.key, **more}

    def cli_options(self, **more: object) -> list[str]:
        out = []
        for key, value in self.options(**more).items():
            out += ["-O", f"measurer.{key}={value}"]
        return out

    def add_server(self, plain: bool = False, key: str | None = None, threads: int | None = None) -> subprocess.Popen:
        """``plain``: TVM's own server (python -m tvm.exec.rpc_server), which does not know tunecore, with
        ``TVM_NUM_THREADS=threads`` (None: TVM's own default, half the CPUs it counts)."""
        port = free_port()
        if plain:
            env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "TUNECORE_SET_TVM_NUM_THREADS")}
            if threads:
                env["TVM_NUM_THREADS"] = str(threads)
            process = subprocess.Popen(
                [sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(port),
                 "--port-end", str(port + 1), "--tracker", self.address, "--key", key or self.key],
                start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        else:
            process = start("fleet", "server", "--tracker", self.address, "--key", key or self.key,
                            "--port", str(port), "--port-end", str(port + 1), log=self._log(f"server-{port}"))
        self.servers.append(process)
        self.server_ports.append(port)
        self.keys.append(key or self.key)
        return process

    def ports(self, key: str | None = None) -> list[int]:
        """The ports of the servers under ``key`` (default: the fleet's)."""
        return [p for p, k in zip(self.server_ports, self.keys) if k == (key or self.key)]

    def registered(self, key: str | None = None) -> int:
        from tunecore.errors import MeasurerUnavailable

        try:
            return len(self.tracker.servers(key or self.key))
        except MeasurerUnavailable:
            return 0

    def wait_for(self, servers: int, key: str | None = None, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while self.registered(key) != servers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.registered(key)} servers registered, not {servers}")
            time.sleep(0.2)

    def restart_tracker(self) -> None:
        signal_group(self.tracker_process)
        deadline = time.monotonic() + 30
        while not _free(self.port):  # the killed tracker's process lets go of its port
            assert time.monotonic() < deadline, f"port {self.port} stays taken"
            time.sleep(0.1)
        self.tracker_process = start("fleet", "tracker", "--port", str(self.port), log=self._log("tracker"))

    def _log(self, name: str) -> str:
        return os.path.join(self.log_dir, f"{name}.log")

    def logs(self) -> str:
        """What the tracker and the tunecore servers printed, each under its name, with the time of asking."""
        parts = [f"fleet logs at {time.strftime('%H:%M:%S')}"]
        for name in sorted(os.listdir(self.log_dir)):
            with open(self._log(name[:-4]), errors="replace") as file:
                parts.append(f"--- {name}\n{file.read()[-4000:]}")
        return "\n".join(parts)

    def close(self) -> None:
        for process in [*self.servers, self.tracker_process]:
            signal_group(process, signal.SIGCONT)
            signal_group(process)
        shutil.rmtree(self.log_dir, ignore_errors=True)


class Postgres:
    """A throwaway PostgreSQL server on 127.0.0.1 (Debian's package: initdb and pg_ctl, run as the postgres user
    when we are root, since initdb refuses root), or the server TUNECORE_TEST_PG_URL names."""

    def __init__(self, directory: str):
        import glob

        self.external = os.environ.get("TUNECORE_TEST_PG_URL")
        if self.external:
            self.url = self.external.rstrip("/")
            return
        found = shutil.which("initdb") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))), None)
        if found is None:
            raise FileNotFoundError("PostgreSQL is not installed: apt-get install postgresql (bash .ci/run does)")
        self.bin = os.path.dirname(os.path.realpath(found))
        self.directory, self.port = directory, free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(directory, "postgres")
        self._pg("initdb", "-D", f"{directory}/data", "-A", "trust", "-U", "tunecore", "--no-sync")
        self._pg("pg_ctl", "-D", f"{directory}/data", "-l", f"{directory}/log", "-w", "-o",
                 f"-c listen_addresses=127.0.0.1 -p {self.port} -k {directory} -c fsync=off", "start")
        self.url = f"//tunecore@127.0.0.1:{self.port}"

    def _pg(self, program: str, *args: str) -> None:
        subprocess.run([*self.as_user, f"{self.bin}/{program}", *args], check=True, capture_output=True, timeout=120)

    def database(self, name: str) -> str:
        """The store location (for ``postgresql:LOCATION``) of a new, empty database."""
        import psycopg

        with psycopg.connect(f"postgresql:{self.url}/postgres", autocommit=True) as db:
            db.execute(f'DROP DATABASE IF EXISTS "{name}"')
            db.execute(f'CREATE DATABASE "{name}"')
        return f"{self.url}/{name}"

    def stop(self) -> None:
        if not self.external:
            self._pg("pg_ctl", "-D", f"{self.directory}/data", "-m", "immediate", "-w", "stop")
