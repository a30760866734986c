"""Result files of experiments: the environment they ran in, their command line, and JSON + markdown under
bench/results/."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any, Sequence


def environment(target: Any = None) -> dict[str, Any]:
    """Where an experiment ran: CPU, cores, target (default: this machine), device, versions, installed plugins."""
    import importlib.metadata
    import platform

    from tunecore.registry import describe_plugins
    from tunecore.targets import device_descriptor, resolve_target
    from tunecore.tvmjson import target_to_json

    this_machine = resolve_target("llvm")
    host = device_descriptor(this_machine)
    device = host if target is None else device_descriptor(target)
    target = this_machine if target is None else target
    return {
        "cpu": host.get("cpu") or platform.processor(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "target": json.loads(target_to_json(target)),
        "device": device,
        "versions": {d: importlib.metadata.version(d) for d in ("apache-tvm", "apache-tvm-ffi", "tunecore")},
        "plugins": describe_plugins(),
    }

def script_parser(doc: str, script: str) -> argparse.ArgumentParser:
    """The argument parser of a benchmark script: described by its docstring's first line, with ``--out``
    (default: the ``results`` folder beside the script)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(script)), "results"),
                        help="where <name>.json and <name>.md are written (default: %(default)s)")
    return parser

def labelled_paths(parser: argparse.ArgumentParser, option: str, specs: list[str], what: str) -> dict[str, str]:
    """{label: path} from a repeatable ``option LABEL=FILE``, or the parser's error unless every label is given once
    with a path."""
    paths = dict(spec.partition("=")[::2] for spec in specs)
    if not paths or len(paths) != len(specs) or not all(paths) or not all(paths.values()):
        parser.error(f"name each {what} once: {option} LABEL=FILE")
    return paths

def command_line(script: str) -> str:
    """How this benchmark was invoked, for the report, quoted so that it can be pasted into a shell."""
    return shlex.join(["python", f"bench/{script}", *sys.argv[1:]])

def environment_line(report: dict, threads: int | None = None) -> str:
    """The line of a results markdown that says where and how it was measured."""
    env = report["environment"]
    cores = f"{env['cores']} cores" + (f", kernels on {threads} threads" if threads is not None else "")
    return (f"CPU: {env['cpu']} ({cores}), target `{json.dumps(env['target'])}`, "
            f"TVM {env['versions']['apache-tvm']}. Command: `{report['command']}`.")

def dataset_record(path: str, info: dict[str, Any], **more: Any) -> dict[str, Any]:
    """What a result file says about the dataset it evaluated on (``info``: ``Dataset.info()``)."""
    return {"path": path, "rows": info["rows"], "measured": info["measured"], "tasks": info["tasks"],
            "devices": {d: v["description"] for d, v in info["devices"].items()}, **more}


def dataset_target(path: str) -> str:
    """The target (JSON) a dataset of one device was measured with: what to build for to add to it."""
    from tunecore.dataset.table import Dataset
    from tunecore.errors import UsageError

    targets = [t for device in Dataset.load(path).info()["devices"].values() for t in device["targets"]]
    if len(targets) != 1:
        raise UsageError(f"{path}: {len(targets)} targets; expected a dataset measured with one")
    return targets[0]


def dataset_line(data: dict[str, Any]) -> str:
    """The sentence a result page opens with about its dataset (``data``: ``dataset_record``)."""
    return (f"Dataset `{data['path']}`: {data['measured']} measured programs ({data['rows']} rows) of {data['tasks']} "
            f"tasks on {len(data['devices'])} devices")


def split_tables(results: dict[str, dict], columns: Sequence[str]) -> list[str]:
    """Markdown lines: per split of ``tunecore.dataset.evaluate`` results, its sizes and a row per cost model."""
    from tunecore.cli.render import cell
    from tunecore.dataset.evaluate import table_rows

    lines = []
    for name, result in results.items():
        lines += [f"## {name}: `{result['split']}`", "",
                  f"train {result['train']['measurements']} measurements, test {result['test']['measurements']} "
                  f"programs in {result['test']['groups']} task x device groups", "",
                  "| cost model | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
        for model, metrics in table_rows(result).items():
            lines.append(f"| {model} | " + " | ".join(cell(metrics.get(c)) for c in columns) + " |")
        lines.append("")
    return lines

def write_results(out_dir: str, name: str, report: dict, markdown: str) -> None:
    """bench/results/<name>.json and .md; the markdown is also printed."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(markdown)
    print(markdown)
