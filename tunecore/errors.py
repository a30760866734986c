"""Errors that tunecore reports to a user as one line and exit code 2, and how a TVM error becomes one line."""


class UsageError(Exception):
    """A mistake the user can fix: unknown plugin, bad target, unreadable model, wrong store...

    The CLI prints ``str(error)`` on one line and exits with code 2; it never shows a traceback for it.
    """


class PluginError(UsageError):
    """A plugin problem: a duplicate or unknown component name, an incompatible combination."""


def error_line(error: BaseException, limit: int = 1000) -> str:
    """The informative line of a (possibly remote, multi-line) error: the last 'SomethingError: ...' line."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line.split(":", 1)[0]:
            return line[:limit]
    return (lines[-1] if lines else type(error).__name__)[:limit]
