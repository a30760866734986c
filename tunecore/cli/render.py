"""What every command prints with: the console, progress bars and number formats."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any, Callable, Iterator

from tunecore.progress import Progress
from tunecore.report import ms  # noqa: F401  (the one millisecond format, for the commands)


def console(stderr: bool = False) -> Any:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # rich assumes 80 columns when writing to a file or pipe and cuts wide tables to fit: there, nothing is cut
    # (tables take their natural width, lines stay whole for grep)
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 1000
    return Console(stderr=stderr, width=width)


def progress(*columns: Any, after: tuple = (), transient: bool = False) -> Any:
    """A progress display on stderr: description, bar, done/total, ``columns``, elapsed time, ``after``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), *columns,
                    TimeElapsedColumn(), *after, console=console(stderr=True), transient=transient)


@contextlib.contextmanager
def tracker(transient: bool = False) -> Iterator[Callable[[Progress], None]]:
    """A progress display on stderr for any job that reports ``tunecore.progress.Progress``: one bar per stage,
    with the failures, the loss and the item where the job reports them."""
    from rich.progress import TextColumn, TimeRemainingColumn

    display = progress(TextColumn("{task.fields[note]}"), after=(TextColumn("ETA"), TimeRemainingColumn()),
                       transient=transient)
    bars: dict[str, Any] = {}
    # a log file (nohup ... &) gets plain lines instead of a live display: one a minute, and a stage's end
    logged = {"at": 0.0}

    def on_progress(p: Progress) -> None:
        if p.stage not in bars:
            bars[p.stage] = display.add_task(p.stage, total=p.total, note="")
            display.start()
        note = " ".join(filter(None, [f"failed {p.failed}" if p.failed else "",
                                      f"loss {p.loss:.3f}" if p.loss is not None else "", p.item[:40]]))
        display.update(bars[p.stage], completed=p.done, total=p.total, note=note)
        if not transient and not sys.stderr.isatty() and (time.monotonic() - logged["at"] >= 60 or p.done == p.total):
            logged["at"] = time.monotonic()
            print(f"{time.strftime('%H:%M:%S')} {p.stage}: {p.done}/{p.total if p.total is not None else '?'} {note}",
                  file=sys.stderr, flush=True)

    try:
        yield on_progress
    finally:
        stop(display)


def stop(display: Any) -> None:
    """Stop a progress display; one that never started would print an empty line before a usage error."""
    if display.live.is_started:
        display.stop()


def best(seconds: float | None) -> str:
    """A best-so-far latency for a progress line."""
    return "-" if seconds is None else f"{ms(seconds)} ms"


def cell(value: Any) -> str:
    """A JSON value as a table cell."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):
        return ", ".join(f"{v} {k}" for k, v in value.items()) or "-"
    return str(value)


def fields(out: dict[str, Any], as_json: bool) -> None:
    """A command's result on stdout: JSON, or one ``key: value`` line per field."""
    import json

    if as_json:
        print(json.dumps(out, indent=2))
        return
    for key, value in out.items():
        print(f"{key}: {json.dumps(value) if isinstance(value, dict) else cell(value)}")
