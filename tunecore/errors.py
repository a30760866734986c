"""Errors that tunecore reports to a user as one line and exit code 2."""


class UsageError(Exception):
    """A mistake the user can fix: unknown plugin, bad target, unreadable model, wrong store...

    The CLI prints ``str(error)`` on one line and exits with code 2; it never shows a traceback for it.
    """


class PluginError(UsageError):
    """A plugin problem: a duplicate or unknown component name, an incompatible combination."""
