"""``tunecore records list|best|check|export|import|upgrade``: inspect stored records; check that the best compute
their tasks; MetaSchedule JSON databases both ways; copy a store into another; upgrade a shared store's schema."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tunecore.cli import Parser, render
from tunecore.cli.args import add_common
from tunecore.errors import UsageError, error_line


def add_commands(register: Any) -> None:
    records = register("records", cmd_records, help="inspect, export and import stored records")
    sub = records.add_subparsers(dest="records_command", required=True, parser_class=Parser)
    listing = sub.add_parser("list", help="per task: trials, errors, best latency")
    add_common(listing, model=False, target=False)
    listing.add_argument("--model", "-m", default=None, help="only tasks of this workload (as given to `run`)")
    best = sub.add_parser("best", help="the best record of each task, with its schedule")
    add_common(best, model=False, target=False)
    best.add_argument("--model", "-m", default=None, help="only tasks of this workload")
    export = sub.add_parser("export", help="write records in another tool's format")
    add_common(export, model=False, target=False, json_flag=False)
    export.add_argument("--format", choices=["metaschedule"], default="metaschedule")
    export.add_argument("--model", "-m", default=None, help="only tasks of this workload")
    export.add_argument("directory")
    imported = sub.add_parser("import", help="read records written by another tool, or copy another tunecore store "
                                            "(e.g. a sqlite file into a shared postgresql store)")
    add_common(imported, model=False, json_flag=False)
    imported.set_defaults(target=None)
    imported.add_argument("--format", choices=["metaschedule", "tunecore"], default="metaschedule",
                          help="metaschedule: a JSONDatabase directory; tunecore: a --store value (file or URL)")
    imported.add_argument("source", metavar="SOURCE")
    check = sub.add_parser("check", help="check that each task's best records compute the task; mark the wrong ones "
                                         "failed (stores made before tunecore checked outputs)")
    add_common(check, model=False, target=False)
    check.add_argument("--model", "-m", default=None, help="only tasks of this workload")
    check.add_argument("--recheck", action="store_true",
                       help="also check records that were checked when they were measured")
    upgrade = sub.add_parser("upgrade", help="bring a shared store written by an older tunecore to this one's schema "
                                             "(once, with no job using it)")
    add_common(upgrade, model=False, target=False, json_flag=False)


def cmd_records(args: argparse.Namespace) -> int:
    from tunecore import api

    if args.records_command == "upgrade":
        return _records_upgrade(args)
    store = api.open_store(args.store, create=args.records_command == "import")
    try:
        return _RECORD_COMMANDS[args.records_command](args, store)
    finally:
        store.close()


def _tasks_of(store: Any, model: str | None) -> list[Any]:
    tasks = store.get_tasks(model=model)
    if model is not None and not tasks:
        models = sorted({t.model for t in store.get_tasks() if t.model})
        raise UsageError(f"the store has no tasks of model {model!r}; models in it: {', '.join(models) or 'none'}")
    return tasks


def _task_rows(store: Any, model: str | None, with_errors: bool = False,
               with_records: bool = False) -> list[dict[str, Any]]:
    """One row per task; its failure count ("errors": a scan of every record) and its records ("stored": a
    large store's take seconds and hundreds of MB to load) only when asked."""
    tasks = _tasks_of(store, model)
    ids = [t.task_id for t in tasks]
    counts = store.counts(ids)
    failures = store.failure_counts(ids) if with_errors else {}
    rows = []
    for t in tasks:
        best = store.best(t.task_id)
        records = store.records(t.task_id) if with_records and counts[t.task_id] else []
        rows.append({
            "name": t.name, "model": t.model, "task_id": t.task_id, "kernel_class": t.kernel_class, "weight": t.weight,
            "flops": t.flops, "trials": counts[t.task_id], "errors": failures.get(t.task_id),
            "best_latency_s": best[0].latency if best else None, "best": best[0] if best else None,
            "stored": records, "task": t,
        })
    return rows


def _records_list(args: argparse.Namespace, store: Any) -> int:
    rows = _task_rows(store, args.model, with_errors=True, with_records=args.json)
    if args.json:
        devices = store.devices()
        for row in rows:
            row["records"] = [
                {"trial": r.trial, "latency_s": r.latency, "error": r.error, "origin": r.origin, "run_id": r.run_id,
                 "measured_at": r.measured_at, "device_id": r.device_id, "device": devices.get(r.device_id)}
                for r in row["stored"]
            ]
        print(json.dumps([{k: v for k, v in r.items() if k not in ("best", "stored", "task")} for r in rows], indent=2))
        return 0
    from rich.table import Table

    table = Table(title=f"{len(rows)} tasks in the store")
    for column in ("task", "model", "kernel class", "trials", "errors", "best ms"):
        table.add_column(column, overflow="fold")
    for r in rows:
        table.add_row(r["name"], r["model"], r["kernel_class"], str(r["trials"]), str(r["errors"]),
                      render.ms(r["best_latency_s"]))
    render.console().print(table)
    return 0


def _records_best(args: argparse.Namespace, store: Any) -> int:
    rows = [r for r in _task_rows(store, args.model) if r["best"] is not None]
    if args.json:
        out = [{"name": r["name"], "model": r["model"], "task_id": r["task_id"], "latency_s": r["best"].latency,
                "run_secs": r["best"].run_secs, "trial": r["best"].trial, "origin": r["best"].origin,
                "measured_at": r["best"].measured_at, "trace": json.loads(r["best"].trace_json)} for r in rows]
        print(json.dumps(out, indent=2))
        return 0
    console = render.console()
    if not rows:  # say so rather than print nothing, which reads like a failure
        of_model = f" of model {args.model}" if args.model else ""
        console.print(f"no task{of_model} in the store has a measured record", markup=False, highlight=False)
    for r in rows:
        console.rule(f"{r['name']}  ({r['model']})  best {render.ms(r['best'].latency)} ms at trial {r['best'].trial}")
        try:
            trace = str(r["best"].candidate(r["task"]).trace)
        except Exception as e:  # e.g. a store written by another TVM: show the trace as stored
            trace = f"(this trace does not replay on the task: {error_line(e)})\n{r['best'].trace_json}"
        console.print(trace, markup=False, highlight=False)
    return 0


def _records_export(args: argparse.Namespace, store: Any) -> int:
    from tunecore.store.metaschedule import export_metaschedule

    tasks = _tasks_of(store, args.model)
    written = export_metaschedule(store, args.directory, tasks)
    print(f"wrote {written} records of {len(tasks)} tasks to {args.directory} (MetaSchedule JSONDatabase)")
    return 0


def _records_import(args: argparse.Namespace, store: Any) -> int:
    from tunecore import api
    from tunecore.store import copy_store
    from tunecore.store.metaschedule import import_metaschedule
    from tunecore.targets import resolve_target

    if args.format == "tunecore":
        source = api.open_store(args.source, create=False)
        try:
            runs, records = copy_store(source, store, args.source)
        finally:
            source.close()
        print(f"imported {records} records and {runs} runs from {args.source}")
        return 0
    target = resolve_target(args.target) if args.target else None
    n_tasks, n_records = import_metaschedule(store, args.source, target)
    print(f"imported {n_records} records of {n_tasks} tasks from {args.source}; their outputs were not checked: "
          f"`tunecore records check --store {args.store or 'tunecore.db'}` checks each task's best")
    return 0


def _records_check(args: argparse.Namespace, store: Any) -> int:
    """Each task's best record checked on this machine (tunecore.check.verify_best), the wrong ones marked failed."""
    from tunecore.check import verify_best
    from tunecore.measure.local import LocalMeasurer
    from tunecore.roles import RecordStore

    if type(store).mark_failed is RecordStore.mark_failed:
        raise UsageError(f"--store {args.store}: record store '{store.name}' cannot mark records as failed")
    rows = [r for r in _task_rows(store, args.model) if r["best"] is not None]
    measurers: dict[str, Any] = {}
    out = []
    try:
        for row in rows:
            task = row["task"]
            if task.target_json not in measurers:
                try:
                    measurers[task.target_json] = LocalMeasurer(task.target)
                except UsageError as error:  # e.g. a CUDA task on a machine without a GPU
                    measurers[task.target_json] = str(error)
            measurer = measurers[task.target_json]
            if isinstance(measurer, str):
                out.append({"name": task.name, "model": row["model"], "task_id": task.task_id, "checked": 0,
                            "wrong": [], "best": None, "note": f"not checked: {measurer}"})
                continue
            report = verify_best(store, task, measurer, recheck=args.recheck)
            note = "; ".join(f"{key[:8]} not checked: {why}" for key, why in report["unverified"])
            out.append({"name": task.name, "model": row["model"], "task_id": task.task_id,
                        "checked": report["checked"], "wrong": [{"key": k, "error": e} for k, e in report["wrong"]],
                        "best": report["best"], "best_latency_s": report["best_latency_s"], "note": note})
    finally:
        for measurer in measurers.values():
            if not isinstance(measurer, str):
                measurer.close()
    wrong = sum(len(r["wrong"]) for r in out)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    from rich.table import Table

    table = Table(title=f"{len(out)} tasks checked: {wrong} wrong records marked failed")
    for column in ("task", "model", "checked now", "wrong", "best ms", "note"):
        table.add_column(column, overflow="fold")
    for r in out:
        table.add_row(r["name"], r["model"], str(r["checked"]), str(len(r["wrong"])),
                      render.ms(r.get("best_latency_s")), r["note"])
    render.console().print(table)
    return 0


def _records_upgrade(args: argparse.Namespace) -> int:
    from tunecore.registry import Registry
    from tunecore.store import parse_store_url

    registry = Registry.shared()
    name, location = parse_store_url(args.store, registry.names("store"))
    if name == "postgresql":
        registry.get("store", name)(location, upgrade=True).close()
    else:  # a file store upgrades itself when it is opened by its one user
        from tunecore import api

        api.open_store(args.store, create=False).close()
    print(f"{args.store}: schema is current")
    return 0


_RECORD_COMMANDS = {"list": _records_list, "best": _records_best, "check": _records_check, "export": _records_export,
                    "import": _records_import}
