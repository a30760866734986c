"""``tunecore dataset collect|remeasure|info|export|import|merge``: program datasets (see tunecore.dataset)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from tunecore.cli import Parser, render
from tunecore.cli.args import add_seed, count, duration, names, number
from tunecore.errors import UsageError


def add_commands(register: Any) -> None:
    from tunecore.schedulers import SCHEDULERS

    dataset = register("dataset", cmd_dataset, help="collect, inspect and combine datasets of measured programs")
    sub = dataset.add_subparsers(dest="dataset_command", required=True, parser_class=Parser)

    collect = sub.add_parser("collect", help="measure programs of every task of the workloads (resumable)")
    collect.add_argument("--model", "-m", action="append", required=True,
                         help="workload (as for `run`), repeatable or comma-separated; zoo:all and op:ansor name sets")
    collect.add_argument("--target", "-t", action="append", default=None,
                         help="a device to collect on, repeatable (default: this CPU with one thread; "
                              "`llvm` for all its cores)")
    collect.add_argument("--per-task", type=count(1), required=True,
                         help="programs per task on each device: clean or failed ones (a program whose timings stay "
                              "noisy is flagged, kept, and replaced by another of its kind, random or guided)")
    collect.add_argument("--out", "-o", required=True, help="dataset file (.parquet); extended if it exists")
    collect.add_argument("--random-fraction", type=number(0, 1), default=0.5,
                         help="share of each task's programs sampled uniformly; the rest come from --search "
                              "(default 0.5)")
    collect.add_argument("--search", default="ansor", help="the guided search (default: ansor)")
    collect.add_argument("--cost-model", default="xgb", help="the guided search's cost model (default: xgb)")
    collect.add_argument("--max-programs", type=count(1), default=None,
                         help="stop after measuring this many, per device")
    collect.add_argument("--kernels", type=names, default=[],
                         help="only tasks whose kernel class contains one of these comma-separated operator names, "
                              "e.g. conv,dense,matmul (default: every task)")
    _add_run_limits(collect)

    remeasure = sub.add_parser("remeasure", help="measure the dataset's programs on another device (the same traces)")
    remeasure.add_argument("dataset")
    remeasure.add_argument("--target", "-t", default=None,
                           help="the device to measure on (default: this CPU with one thread)")
    remeasure.add_argument("--per-task", type=count(1), default=None, help="at most this many programs per task")
    remeasure.add_argument("--from-device", default=None,
                           help="only programs measured on this device (id or prefix; default: any)")
    remeasure.add_argument("--again-before", type=moment, default=None, metavar="TIME",
                           help="measure again the programs this device measured before TIME (Unix seconds or "
                                "ISO date-time, UTC unless it says), replacing their rows; run again with the "
                                "same TIME to resume")
    remeasure.add_argument("--second-labels", action="store_true",
                           help="measure this device's programs once more and keep that latency beside each row's "
                                "own (the noise ceiling of `costmodel eval`); resumes")
    _add_run_limits(remeasure)

    info = sub.add_parser("info", help="counts by device, workload and task")
    info.add_argument("dataset")
    info.add_argument("--json", action="store_true")

    export = sub.add_parser("export", help="write a record store's measurements as a dataset")
    export.add_argument("--store", "-s", default=None, help="record store (default: tunecore.db)")
    export.add_argument("--model", "-m", action="append", default=None, help="only tasks of this workload")
    export.add_argument("--out", "-o", required=True)

    imported = sub.add_parser("import", help="put a dataset's measurements into a record store")
    imported.add_argument("dataset")
    imported.add_argument("--store", "-s", default=None, help="record store (default: tunecore.db)")

    batch = sub.add_parser("export-batch", help="build random programs (or a search's) of the workloads' tasks into "
                                                "a directory, to be timed on a machine without TVM's compiler "
                                                "(`python -m tunecore.measure.batch DIR` there)")
    batch.add_argument("--model", "-m", action="append", required=True, help="workload (as for `collect`)")
    batch.add_argument("--target", "-t", required=True,
                       help="the device's target, e.g. nvidia/nvidia-h100 or a JSON dict with its arch")
    size = batch.add_mutually_exclusive_group(required=True)
    size.add_argument("--per-task", type=count(1), help="programs per task")
    size.add_argument("--trials", type=count(1),
                      help="programs in all, split over the tasks as `run`'s --scheduler gives out trials, from what "
                           "the --store's records say each task gains (tasks in turn where nothing is measured yet; "
                           "on ResNet-18 it did not beat --per-task, docs/gpu.md)")
    batch.add_argument("--scheduler", choices=sorted(SCHEDULERS), default=None,
                       help="with --trials: how they are split (default: gradient, as in `run`)")
    batch.add_argument("--search", default="random",
                       help="who writes the programs: random (uniform samples, default) or a search policy, whose "
                            "next batch is taken (e.g. tlm; ansor with --cost-model and --store)")
    batch.add_argument("--cost-model", default="none",
                       help="the search's cost model, trained first on the --store's records (default: none)")
    batch.add_argument("--store", "-s", default=None,
                       help="record store with these tasks' records for this target (earlier batches, timed and "
                            "imported: `tunecore dataset import`): the batch is the search's next round, and no "
                            "program measured before is built again")
    batch.add_argument("--option", "-O", action="append", metavar="ROLE.KEY=VALUE",
                       help="the search's and cost model's options, as for `run`, e.g. -O search.weights=FILE")
    batch.add_argument("--kernels", type=names, default=[], help="only tasks of these operators (as for `collect`)")
    batch.add_argument("--tasks", type=names, default=[], help="only tasks of these names (as `dataset info` lists)")
    batch.add_argument("--second-labels-of", metavar="DATASET", default=None,
                       help="instead of new programs, DATASET's programs of these tasks that have no second label "
                            "yet (the first --per-task of a task, as `remeasure` takes them), measured on "
                            "--from-device: timed on that device and imported back into DATASET, each gets its "
                            "second label (the yardstick's noise ceiling)")
    batch.add_argument("--from-device", default=None,
                       help="with --second-labels-of: the device whose labels to repeat (id or prefix; default: the "
                            "dataset's only device)")
    batch.add_argument("--out", "-o", required=True, help="the batch directory (created)")
    add_seed(batch, "the random programs")
    batch.add_argument("--json", action="store_true")

    unbatch = sub.add_parser("import-batch", help="put a timed batch's results (and profiles) into a dataset")
    unbatch.add_argument("directory")
    unbatch.add_argument("--out", "-o", required=True, help="dataset file (.parquet); extended if it exists")
    unbatch.add_argument("--json", action="store_true")

    merge = sub.add_parser("merge", help="combine datasets (e.g. collected on different machines) into one")
    merge.add_argument("datasets", nargs="+")
    merge.add_argument("--out", "-o", required=True)


def _add_run_limits(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-spread", type=number(0), default=0.02, metavar="S",
                   help="a program whose timings spread (std/mean) more than S is measured once more, then flagged "
                        "noisy (default 0.02; 0: never measured again)")
    p.add_argument("--anchors", type=count(0), default=300, metavar="N",
                   help="fixed programs measured at the start and the end of the run, to see the machine drift "
                        "(default 300; 0: none)")
    p.add_argument("--time-limit", type=duration, default=None, metavar="DURATION",
                   help="stop (saved, resumable) after this long: 3600, 90m, 2h")
    p.add_argument("--measurer", default="local", help="measurer (see `tunecore plugins`)")
    p.add_argument("--option", "-O", action="append", metavar="ROLE.KEY=VALUE",
                   help="component option, as for `run`, e.g. -O measurer.repeat=5")
    add_seed(p, "the choice of programs (random samples, the anchors, which programs to remeasure)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def moment(text: str) -> float:
    import datetime

    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a time: {text!r} (e.g. 2026-11-24T04:00 or 1795492800)") from None
    return (when if when.tzinfo else when.replace(tzinfo=datetime.timezone.utc)).timestamp()


def cmd_dataset(args: argparse.Namespace) -> int:
    return _COMMANDS[args.dataset_command](args)


def _collect(args: argparse.Namespace) -> int:
    from tunecore.dataset.collect import CollectPlan, collect
    from tunecore.options import parse_options
    from tunecore.workloads import expand_models

    _check_suffix(args.out)
    plan = CollectPlan(expand_models(args.model), targets=args.target, per_task=args.per_task,
                       random_fraction=args.random_fraction, search=args.search, cost_model=args.cost_model,
                       measurer=args.measurer, seed=args.seed, max_programs=args.max_programs,
                       time_limit=args.time_limit, max_spread=args.max_spread, anchors=args.anchors,
                       kernels=tuple(args.kernels),
                       options=parse_options(args.option, [args.search, args.cost_model, args.measurer, "random"]))
    report = _with_progress(args, lambda on_progress: collect(args.out, plan, on_progress=on_progress))
    _print_report(args, report, [(d["device"], d["measured"], d["failed"], d["stopped"], d.get("drift"))
                                for d in report["devices"]])
    return 0


def _remeasure(args: argparse.Namespace) -> int:
    from tunecore.dataset.collect import remeasure
    from tunecore.options import parse_options

    options = parse_options(args.option, [args.measurer])
    report = _with_progress(args, lambda on_progress: remeasure(
        args.dataset, args.target, per_task=args.per_task, source_device=args.from_device,
        again_before=args.again_before, measurer_name=args.measurer,
        options=options, seed=args.seed, time_limit=args.time_limit, max_spread=args.max_spread,
        anchors=args.anchors, second_labels=args.second_labels, on_progress=on_progress))
    _print_report(args, report, [(report["device"], report["measured"], report["failed"], report["stopped"],
                                   report.get("drift"))])
    return 0


def _with_progress(args: argparse.Namespace, work: Any) -> Any:
    with render.tracker(transient=args.json) as on_progress:
        return work(on_progress)


def _print_report(args: argparse.Namespace, report: dict[str, Any], devices: list[tuple]) -> None:
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for device, measured, failed, stopped, drift in devices:
        print(f"{device}: measured {measured} programs ({failed} failed)"
              + (f"; anchors moved {drift['ratio']:.3f}x (MAPE {drift['mape']:.1%})" if drift else "")
              + (f"; stopped by the {stopped}, run the same command to go on" if stopped else ""))
    print(f"{report['dataset']}: {report['elapsed_s']} s")


def _info(args: argparse.Namespace) -> int:
    from rich.table import Table

    from tunecore.dataset.table import Dataset

    info = Dataset.load(args.dataset).info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    console = render.console()
    console.print(f"{args.dataset}: {info['rows']} measurements ({info['failed']} failed) of {info['programs']} "
                  f"programs, {info['tasks']} tasks, {len(info['devices'])} devices")
    devices = Table(title="devices (clean: timed >= 5 times within 2%; anchors: latest against first, worst "
                          "within a run)")
    for column in ("device id", "device", "CPU family/model", "measured", "failed", "clean", "median spread",
                   "anchors"):
        devices.add_column(column)
    for identity, d in info["devices"].items():
        devices.add_row(identity, d["description"], d["device"].get("family_model", ""), str(d["measured"]),
                        str(d["rows"] - d["measured"]), str(d["clean"]), render.cell(d["median_spread"]),
                        _drift_cell(d["anchor_drift"]))
    console.print(devices)
    workloads = Table(title="workloads")
    for column in ("workload", "tasks", "measurements"):
        workloads.add_column(column)
    for name, w in info["workloads"].items():
        workloads.add_row(name, str(w["tasks"]), str(w["rows"]))
    console.print(workloads)
    return 0


def _drift_cell(summary: dict[str, Any] | None) -> str:
    if not summary:
        return "-"
    parts = [f"{summary['runs']} runs"]
    for name, key in (("latest", "latest_vs_first"), ("within", "worst_within_run")):
        if summary[key]:
            parts.append(f"{name} {summary[key]['ratio']:.3f}x")
    return ", ".join(parts)


def _export(args: argparse.Namespace) -> int:
    from tunecore import api
    from tunecore.dataset.table import Dataset, changing

    _check_suffix(args.out)
    store = api.open_store(args.store, create=False)
    try:
        dataset, unknown = Dataset.from_store(store, args.model)
    finally:
        store.close()
    with changing(args.out):
        if os.path.exists(args.out):
            existing = Dataset.load(args.out)
            existing.merge(dataset)
            dataset = existing
        dataset.save(args.out)
    print(f"{args.out}: {len(dataset.rows)} measurements"
          + (f"; left out {unknown} records that do not say which device measured them" if unknown else ""))
    return 0


def _import(args: argparse.Namespace) -> int:
    from tunecore import api
    from tunecore.dataset.table import Dataset

    dataset = Dataset.load(args.dataset)
    store = api.open_store(args.store)
    try:
        added = dataset.to_store(store)
    finally:
        store.close()
    print(f"{args.store or 'tunecore.db'}: {added} new records from {args.dataset}")
    return 0


def _merge(args: argparse.Namespace) -> int:
    from tunecore.dataset.table import Dataset, changing

    _check_suffix(args.out)
    merged = Dataset()
    with changing(args.out):
        for path in args.datasets:
            merged.merge(Dataset.load(path))
        merged.save(args.out)
    print(f"{args.out}: {len(merged.rows)} measurements, {len(merged.devices)} devices")
    return 0


def _export_batch(args: argparse.Namespace) -> int:
    from tunecore import api
    from tunecore.dataset.batch import export_batch, unrepeated_programs
    from tunecore.options import parse_options
    from tunecore.registry import Registry
    from tunecore.targets import resolve_target
    from tunecore.workloads import expand_models

    if os.path.exists(os.path.join(args.out, "manifest.json")):
        raise UsageError(f"--out {args.out}: a batch is there already (time it, or choose another directory)")
    target = resolve_target(args.target)
    registry = Registry.shared()
    if args.search == "random" and (args.option or args.cost_model != "none"):
        raise UsageError("-O, --cost-model: for a search policy's programs (--search NAME); random samples take "
                         "neither")
    if args.scheduler and args.per_task:
        raise UsageError("--scheduler: splits --trials over the tasks; --per-task gives each the same")
    if args.from_device and not args.second_labels_of:
        raise UsageError("--from-device: the device whose programs --second-labels-of builds again")
    if args.second_labels_of and (args.trials or args.search != "random" or args.store):
        raise UsageError("--second-labels-of: the dataset's own programs again, --per-task of them a task; not with "
                         "--trials, --search or --store")
    for role, name in (("search", args.search), ("cost_model", args.cost_model)):
        if name not in registry.names(role):
            raise UsageError(f"--{role.replace('_', '-')} {name}: not installed (installed: "
                             f"{', '.join(registry.names(role))})")
    if args.search != "random":
        registry.check_target(target, search=args.search, cost_model=args.cost_model)
    options = parse_options(args.option, [args.search, args.cost_model])
    dataset_programs = (unrepeated_programs(args.second_labels_of, args.from_device, target.kind.name, args.per_task,
                                            args.seed) if args.second_labels_of else None)
    store = api.open_store(args.store, registry, create=False) if args.store else None
    try:
        report = _with_progress(args, lambda on_progress: export_batch(
            args.out, expand_models(args.model), target, args.per_task, trials=args.trials,
            scheduler=args.scheduler or "gradient", kernels=tuple(args.kernels), task_names=tuple(args.tasks),
            seed=args.seed, search=args.search, cost_model=args.cost_model, store=store, options=options,
            dataset_programs=dataset_programs, registry=registry, on_progress=on_progress))
    finally:
        if store is not None:
            store.close()
    render.fields({**report, "next": f"python -m tunecore.measure.batch {args.out}  (on the device)"}, args.json)
    return 0


def _import_batch(args: argparse.Namespace) -> int:
    from tunecore.dataset.batch import import_batch
    from tunecore.measure.batch import MANIFEST

    _check_suffix(args.out)
    if not os.path.exists(os.path.join(args.directory, MANIFEST)):
        raise UsageError(f"{args.directory}: not a batch directory (no {MANIFEST})")
    try:
        report = import_batch(args.directory, args.out)
    except ValueError as error:
        raise UsageError(str(error)) from None
    render.fields({**report, "dataset": args.out}, args.json)
    return 0


def _check_suffix(path: str) -> None:
    from tunecore.dataset.table import SUFFIX

    if not path.endswith(SUFFIX):
        raise UsageError(f"{path}: a dataset file's name ends in {SUFFIX}")


_COMMANDS = {"collect": _collect, "remeasure": _remeasure, "info": _info, "export": _export, "import": _import,
             "export-batch": _export_batch, "import-batch": _import_batch, "merge": _merge}
