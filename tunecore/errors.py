"""Errors tunecore reports to a user as one line (exit code 2; 1 for a measurer gone), and TVM errors as one line."""


class UsageError(Exception):
    """A mistake the user can fix: unknown plugin, bad target, unreadable model, wrong store...

    The CLI prints ``str(error)`` on one line and exits with code 2; it never shows a traceback for it.
    """


class MeasurerUnavailable(Exception):
    """The measurer cannot measure anything any more (its tracker is gone, no device is left): the run stops.

    Not the user's mistake and not a candidate's failure: the CLI prints ``str(error)`` on one line and
    exits with code 1, with every committed round in the store.
    """


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or `kill`) in a command that says itself what is kept: the CLI prints ``str(error)`` after
    "interrupted; " and exits with code 130, as for any other interruption."""


class PluginError(UsageError):
    """A plugin problem: a duplicate or unknown component name, an incompatible combination."""


def first_line(error: BaseException, limit: int = 1000) -> str:
    """The first line of an error whose message names the problem first and adds hints after it (libpq, the
    ONNX checker), where ``error_line`` would pick a hint."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:limit]


def error_line(error: BaseException, limit: int = 1000) -> str:
    """The informative line of a (possibly remote, multi-line) error: the last 'SomethingError: ...' line."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line.split(":", 1)[0]:
            return line[:limit]
    return (lines[-1] if lines else type(error).__name__)[:limit]
