"""The ``tunecore`` command: one module per subcommand, each registered through the hook
``tunecore_register_commands`` -- the core's by ``tunecore.builtin``, a plugin's by the plugin.

Every user mistake ends as one line on stderr and exit code 2; an interrupted run (Ctrl-C, or ``kill``: SIGTERM)
exits 130 with everything it measured already in the store; output cut short by its reader (``| head``) ends it quietly.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Callable, Sequence

from tunecore.cli.args import add_devices, add_filters, add_seed, count, duration, names, number
from tunecore.errors import Interrupted, MeasurerUnavailable, PluginError, UsageError
from tunecore.options import parse_options

# public (see tunecore.interfaces): what a plugin's commands may use; ``render`` is tunecore.cli.render, the rest the
# argument kit of tunecore.cli.args (every command spells and checks counts, lists and devices alike)
__all__ = ["Parser", "add_devices", "add_filters", "add_seed", "build_parser", "count", "duration", "main", "names",
           "number", "parse_options", "render"]

Handler = Callable[[argparse.Namespace], int]  # runs a command; returns its exit code


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not usage + error
        raise UsageError(f"{self.prog}: {message}")


def build_parser(pm: object | None = None) -> argparse.ArgumentParser:
    """The parser with every registered command. Like the registry, it calls each plugin's hook on its
    own, so that a command name registered twice is an error naming both distributions."""
    from tunecore.plugins import core_version, distribution_of, get_plugin_manager

    pm = pm or get_plugin_manager()
    parser = Parser(prog="tunecore", description="Tensor-program auto-tuning on Apache TVM, with pluggable parts.")
    parser.add_argument("--version", action="version", version=f"tunecore {core_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")
    owners: dict[str, str] = {}

    def registrar(distribution: str) -> Callable[..., argparse.ArgumentParser]:
        def register(name: str, handler: Handler, help: str) -> argparse.ArgumentParser:
            if name in owners:
                raise PluginError(f"command '{name}' is registered twice: by {owners[name]} and by {distribution}; "
                                  "uninstall one of them")
            owners[name] = distribution
            command = commands.add_parser(name, help=help, description=help)
            command.set_defaults(handler=handler)
            return command

        return register

    for impl in pm.hook.tunecore_register_commands.get_hookimpls():  # type: ignore[attr-defined]
        try:
            impl.function(register=registrar(distribution_of(pm, impl.plugin)[0]))
        except UsageError:
            raise
        except Exception as error:  # a broken plugin must not take every command down with it
            name = pm.get_name(impl.plugin)
            getattr(pm, "load_errors", {})[name] = f"{type(error).__name__}: {error}"
            print(f"tunecore: plugin '{name}' failed to add its commands and is skipped: {error}", file=sys.stderr)
    return parser


def _interrupt(_signal: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _what_is_kept() -> str:
    from tunecore import modelfile

    if modelfile.last_checkpoint and os.path.exists(modelfile.last_checkpoint[0]):  # removed once training ends
        path, step = modelfile.last_checkpoint
        return f"training's state at step {step} is kept in {path} (and every committed round)"
    return "every committed round is saved"


def main(argv: Sequence[str] | None = None) -> int:
    from tunecore.measure.local import import_tvm_without_torch

    # `kill PID` stops a command as Ctrl-C does, saving what it measured; a job started with `&` by a script
    # ignores SIGINT, so SIGTERM is how such a job (nohup tunecore dataset collect ... &) is stopped
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        args = build_parser().parse_args(argv)
        import_tvm_without_torch()
        return args.handler(args)
    except UsageError as error:
        print(f"tunecore: error: {error}", file=sys.stderr)
        return 2
    except MeasurerUnavailable as error:
        print(f"tunecore: error: {error}", file=sys.stderr)
        return 1
    except Interrupted as stop:
        print(f"tunecore: interrupted; {stop}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print(f"tunecore: interrupted; {_what_is_kept()}, run the same command to resume", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`... --json | head`): stop quietly, as `cat` does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that exiting flushes nothing
        return 141  # 128 + SIGPIPE
