"""The plugin manager: the core's built-ins plus every plugin in the entry-point group ``tunecore``.

Environment:
  TUNECORE_DISABLE_PLUGIN_AUTOLOAD=1   load no third-party plugin (built-ins only)
  TUNECORE_LOAD_PLUGINS=a,b            load only these entry points (names as in ``tunecore plugins``)
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from typing import Any

import pluggy

from tunecore import hookspecs
from tunecore.errors import PluginError

ENTRY_POINT_GROUP = "tunecore"
DEFAULT_PLUGINS = ("tunecore.builtin",)
CORE_DISTRIBUTION = "tunecore"


class PluginManager(pluggy.PluginManager):
    """pluggy's manager, remembering which plugins failed to load and why (shown by `tunecore plugins`)."""

    def __init__(self) -> None:
        super().__init__("tunecore")
        self.load_errors: dict[str, str] = {}  # entry point name -> error text
        self.registry_cache: tuple[frozenset[int], Any] | None = None  # see Registry.shared


_manager: PluginManager | None = None


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager, built on first use."""
    global _manager
    if _manager is None:
        _manager = new_plugin_manager()
    return _manager


def new_plugin_manager(autoload: bool | None = None) -> PluginManager:
    """A fresh manager with the built-ins and (unless disabled) the installed plugins."""
    pm = PluginManager()
    pm.add_hookspecs(hookspecs)
    for module_name in DEFAULT_PLUGINS:
        pm.register(importlib.import_module(module_name), name=module_name)
    if autoload is None:
        autoload = not os.environ.get("TUNECORE_DISABLE_PLUGIN_AUTOLOAD")
    only = {n.strip() for n in os.environ.get("TUNECORE_LOAD_PLUGINS", "").split(",") if n.strip()}
    if autoload or only:
        _load_entry_points(pm, only)
    pm.check_pending()  # the built-ins: a hookimpl without a spec is a bug in tunecore itself
    return pm


def _load_entry_points(pm: PluginManager, only: set[str]) -> None:
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if only and ep.name not in only:
            continue
        if pm.get_plugin(ep.name) is not None or pm.is_blocked(ep.name):
            continue
        try:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=ep.name)
            refuse_unknown_hooks(pm, ep.name)
        except Exception as error:  # a broken plugin must not take the tool down with it
            pm.load_errors[ep.name] = f"{type(error).__name__}: {error}"
            print(f"tunecore: plugin '{ep.name}' failed to load and is skipped: {error}", file=sys.stderr)


def refuse_unknown_hooks(pm: pluggy.PluginManager, name: str) -> None:
    """Unregister the plugin ``name`` if it implements a hook tunecore does not define (a misspelling
    would otherwise be silently never called) and raise PluginError saying which."""
    plugin = pm.get_plugin(name)
    unknown = sorted(caller.name for caller in pm.get_hookcallers(plugin) or [] if caller.spec is None)
    if unknown:
        pm.unregister(plugin)
        raise PluginError(f"implements {', '.join(unknown)}, which is not a tunecore hook (misspelled?)")


def distribution_of(pm: pluggy.PluginManager, plugin: object) -> tuple[str, str]:
    """(distribution name, version) of a registered plugin object."""
    for registered, dist in pm.list_plugin_distinfo():
        if registered is plugin:
            return dist.metadata["name"], dist.version
    name = pm.get_name(plugin) or repr(plugin)
    if name in DEFAULT_PLUGINS:
        return CORE_DISTRIBUTION, core_version()
    return name, ""


def core_version() -> str:
    try:
        return importlib.metadata.version(CORE_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
