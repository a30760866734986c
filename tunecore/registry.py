"""Name -> component class, per role (and per measurer part: builder, runner, profiler). The registry owns the names.

It calls every plugin's registration hooks one plugin at a time, so that it knows which
distribution registered which class: a duplicate name is an error naming both distributions.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from tunecore.errors import PluginError
from tunecore.plugins import CORE_DISTRIBUTION, PluginManager, distribution_of, get_plugin_manager
from tunecore.roles import MEASURER_PARTS, ROLE_LABELS, ROLES, Component

if TYPE_CHECKING:
    import pluggy
    import tvm

_ROLE_HOOKS = {
    "search": "tunecore_register_search_policies",
    "cost_model": "tunecore_register_cost_models",
    "store": "tunecore_register_record_stores",
    "measurer": "tunecore_register_measurers",
    "builder": "tunecore_register_builders",
    "runner": "tunecore_register_runners",
    "profiler": "tunecore_register_profilers",
}
_BASES = {**ROLES, **MEASURER_PARTS}
_LABELS = {**ROLE_LABELS, **{part: part for part in MEASURER_PARTS}}


@dataclasses.dataclass
class Entry:
    role: str
    cls: type[Component]
    plugin: object
    distribution: str


class Registry:
    def __init__(self, pm: pluggy.PluginManager | None = None):
        self.pm = pm or get_plugin_manager()
        self._entries: dict[str, dict[str, Entry]] = {role: {} for role in _BASES}
        for role, hook_name in _ROLE_HOOKS.items():
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                dist = distribution_of(self.pm, impl.plugin)[0]
                impl.function(register=self._registrar(role, impl.plugin, dist))

    @classmethod
    def shared(cls, pm: PluginManager | None = None) -> Registry:
        """The registry of ``pm`` (the process-wide manager by default), built once per set of plugins,
        so that a plugin's registration hooks run once however many components look a name up."""
        pm = pm or get_plugin_manager()
        plugins = frozenset(map(id, pm.get_plugins()))
        cached = getattr(pm, "registry_cache", None)
        if cached is None or cached[0] != plugins:
            cached = pm.registry_cache = (plugins, cls(pm))
        return cached[1]

    def _registrar(self, role: str, plugin: object, dist: str):
        base = _BASES[role]
        label = _LABELS[role]

        def register(cls: type) -> None:
            if not (isinstance(cls, type) and issubclass(cls, base)):
                raise PluginError(f"{dist} registered {cls!r} as a {label}, but it does not subclass {base.__name__}")
            name = getattr(cls, "name", None)
            if not isinstance(name, str) or not name:
                raise PluginError(f"{dist} registered {label} {cls.__name__} without a `name` attribute")
            existing = self._entries[role].get(name)
            if existing is not None and existing.cls is not cls:
                raise PluginError(
                    f"{label} '{name}' is registered twice: by {existing.distribution} "
                    f"({existing.cls.__module__}.{existing.cls.__qualname__}) and by {dist} "
                    f"({cls.__module__}.{cls.__qualname__}); uninstall one of them"
                )
            self._entries[role][name] = Entry(role, cls, plugin, dist)

        return register

    def names(self, role: str) -> list[str]:
        return sorted(self._entries[role])

    def entries(self) -> list[Entry]:
        return [e for role in _BASES for e in self._entries[role].values()]

    def get(self, role: str, name: str) -> type[Component]:
        entry = self._entries[role].get(name)
        if entry is None:
            label = _LABELS[role]
            installed = ", ".join(self.names(role)) or "none"
            raise PluginError(
                f"unknown {label} '{name}'; installed: {installed} (run `tunecore plugins` to see where they come from)"
            )
        return entry.cls

    def check_target(self, target: tvm.target.Target, **chosen: str) -> None:
        """Refuse, before any work starts, a component that cannot serve ``target``.

        ``chosen`` maps role -> name, e.g. ``search="ansor", measurer="local"``.
        """
        for role, name in chosen.items():
            reason = self.get(role, name).unsupported_reason(target)
            if reason:
                raise PluginError(f"{_LABELS[role]} '{name}' cannot be used with target "
                                  f"{target.kind.name}: {reason}")


def describe_plugins(pm: PluginManager | None = None) -> list[dict[str, Any]]:
    """What ``tunecore plugins`` prints: per plugin its distribution, version, hooks and components."""
    pm = pm or get_plugin_manager()
    registry = Registry.shared(pm)
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
    for name, error in sorted(getattr(pm, "load_errors", {}).items()):
        out.append({"name": name, "distribution": None, "version": None, "hooks": [], "components": {}, "error": error})
    return sorted(out, key=lambda p: (p["distribution"] != CORE_DISTRIBUTION, p["name"]))
