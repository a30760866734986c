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

ENTRY_POINT_GROUP = "tunecore"
DEFAULT_PLUGINS = ("tunecore.builtin",)
CORE_DISTRIBUTION = "tunecore"

_manager: pluggy.PluginManager | None = None
# plugins that failed to import: entry point name -> error text (shown by `tunecore plugins`)
load_errors: dict[str, str] = {}


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, built on first use."""
    global _manager
    if _manager is None:
        _manager = new_plugin_manager()
    return _manager


def new_plugin_manager(autoload: bool | None = None) -> pluggy.PluginManager:
    """A fresh manager with the built-ins and (unless disabled) the installed plugins."""
    pm = pluggy.PluginManager("tunecore")
    pm.add_hookspecs(hookspecs)
    for module_name in DEFAULT_PLUGINS:
        pm.register(importlib.import_module(module_name), name=module_name)
    if autoload is None:
        autoload = not os.environ.get("TUNECORE_DISABLE_PLUGIN_AUTOLOAD")
    only = {n.strip() for n in os.environ.get("TUNECORE_LOAD_PLUGINS", "").split(",") if n.strip()}
    if autoload or only:
        _load_entry_points(pm, only)
    return pm


def _load_entry_points(pm: pluggy.PluginManager, only: set[str]) -> None:
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if only and ep.name not in only:
            continue
        if pm.get_plugin(ep.name) is not None or pm.is_blocked(ep.name):
            continue
        try:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=ep.name)
        except Exception as error:  # a broken plugin must not take the tool down with it
            load_errors[ep.name] = f"{type(error).__name__}: {error}"
            print(f"tunecore: plugin '{ep.name}' failed to load and is skipped: {error}", file=sys.stderr)


def distribution_of(pm: pluggy.PluginManager, plugin: object) -> tuple[str, str]:
    """(distribution name, version) of a registered plugin object."""
    for registered, dist in pm.list_plugin_distinfo():
        if registered is plugin:
            return dist.metadata["name"], dist.version
    name = pm.get_name(plugin) or repr(plugin)
    if name in DEFAULT_PLUGINS:
        return CORE_DISTRIBUTION, _core_version()
    return name, ""


def _core_version() -> str:
    try:
        return importlib.metadata.version(CORE_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def describe_plugins(pm: pluggy.PluginManager | None = None) -> list[dict[str, Any]]:
    """What ``tunecore plugins`` prints: per plugin its distribution, version, hooks and components."""
    from tunecore.registry import Registry

    pm = pm or get_plugin_manager()
    registry = Registry(pm)
    out = []
    for plugin in pm.get_plugins():
        dist, version = distribution_of(pm, plugin)
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        components: dict[str, list[str]] = {}
        for entry in registry.entries():
            if entry.plugin is plugin:
                components.setdefault(entry.role, []).append(entry.cls.name)
        out.append(
            {
                "name": pm.get_name(plugin),
                "distribution": dist,
                "version": version,
                "hooks": hooks,
                "components": {role: sorted(names) for role, names in sorted(components.items())},
            }
        )
    for name, error in sorted(load_errors.items()):
        out.append({"name": name, "distribution": None, "version": None, "hooks": [], "components": {}, "error": error})
    return sorted(out, key=lambda p: (p["distribution"] != CORE_DISTRIBUTION, p["name"]))
