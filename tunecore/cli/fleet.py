"""``tunecore fleet``: a TVM RPC tracker, device servers, and what the tracker has (see docs/fleet.md)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from tunecore.errors import UsageError


def add_commands(register: Any) -> None:
    fleet = register("fleet", cmd_fleet, help="run a TVM RPC tracker or a device server, or show a tracker's devices")
    commands = fleet.add_subparsers(dest="fleet_command", required=True, metavar="COMMAND")
    tracker = commands.add_parser("tracker", help="run a TVM RPC tracker until interrupted",
                                  description="run a TVM RPC tracker until interrupted")
    tracker.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this "
                                                                "machine only; 0.0.0.0 for every interface)")
    tracker.add_argument("--port", type=int, default=9190)
    server = commands.add_parser(
        "server", help="serve this machine's device to a tracker until interrupted (restarted if a kernel crashes it)",
        description="serve this machine's device to a tracker until interrupted; TVM's server is started again "
                    "whenever a kernel crashes it, and it tells the runner which device this is")
    server.add_argument("--tracker", required=True, metavar="HOST:PORT")
    server.add_argument("--key", required=True, help="the device kind's name, e.g. rasp4b or epyc-zen4")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    server.add_argument("--port", type=int, default=9090, help="first port to try (default: 9090)")
    server.add_argument("--port-end", type=int, default=9199)
    status = commands.add_parser("status", help="the devices a tracker has, per key",
                                 description="the devices a tracker has, per key")
    status.add_argument("--tracker", required=True, metavar="HOST:PORT")
    status.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def cmd_fleet(args: argparse.Namespace) -> int:
    from tunecore.measure.board import serve
    from tunecore.measure.rpc import Tracker, parse_address

    if args.fleet_command == "tracker":
        from tvm.rpc.tracker import Tracker as TvmTracker

        try:  # this port or none: servers and runners are told this one
            tracker = TvmTracker(host=args.host, port=args.port, port_end=args.port + 1, silent=True)
        except (OSError, ValueError) as error:
            raise UsageError(f"fleet tracker: cannot listen on {args.host}:{args.port} ({error})") from None
        print(f"rpc tracker on {args.host}:{tracker.port}", flush=True)
        try:
            while tracker.proc.is_alive():
                time.sleep(0.5)
        finally:
            tracker.terminate()
        return 1  # it stopped on its own
    if args.fleet_command == "server":
        serve(parse_address(args.tracker, "--tracker"), args.key, args.host, args.port, args.port_end,
              say=lambda line: print(time.strftime("%H:%M:%S"), line, flush=True))
        return 0
    summary = Tracker(parse_address(args.tracker, "--tracker")).summary()
    keys: dict[str, dict[str, Any]] = {}
    for info in summary.get("server_info", []):
        key = str(info.get("key", "")).removeprefix("server:")
        keys.setdefault(key, {"servers": []})["servers"].append(f"{info['addr'][0]}:{info['addr'][1]}")
    for key, queue in summary.get("queue_info", {}).items():
        keys.setdefault(key, {"servers": []}).update(free=queue.get("free", 0), pending=queue.get("pending", 0))
    if args.json:
        print(json.dumps({"tracker": args.tracker, "keys": keys}, indent=2))
        return 0
    from rich.table import Table

    from tunecore.cli import render

    table = Table(title=f"rpc tracker {args.tracker}")
    for column in ("key", "servers", "free", "waiting requests"):
        table.add_column(column, overflow="fold")
    for key, row in sorted(keys.items()):
        table.add_row(key, " ".join(row["servers"]) or "-", str(row.get("free", 0)), str(row.get("pending", 0)))
    render.console().print(table)
    return 0
