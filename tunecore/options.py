"""Component options: ``-O ROLE.KEY=VALUE`` / ``-O NAME.KEY=VALUE`` parsed, routed and checked."""

from __future__ import annotations

import json
from typing import Any, Sequence

from tunecore.errors import UsageError


def parse_options(pairs: list[str] | None, components: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """``["search.population=64", "xgb.min_data=32"]`` -> {"search": {"population": 64}, "xgb": {"min_data": 32}}.

    A key is ROLE.KEY (for whichever component fills the role) or NAME.KEY, for the component of
    that name only -- so ``tunecore bench --search random,ansor -O ansor.population=64`` leaves
    ``random`` alone. ``components`` are the names this command uses; another NAME is refused.
    """
    roles = {**{role: role for role in ROLES}, "cost-model": "cost_model"}
    options: dict[str, dict[str, Any]] = {role: {} for role in ROLES}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        scope, dot, name = key.partition(".")
        if not (sep and dot and name and (scope in roles or scope in components)):
            raise UsageError(f"--option {pair!r}: expected ROLE.KEY=VALUE with ROLE one of search, cost_model, "
                             f"measurer, or NAME.KEY=VALUE with NAME one of "
                             f"{', '.join(components) or 'the components used'}")
        options.setdefault(roles.get(scope, scope), {})[name.replace("-", "_")] = _parse_value(raw)
    return options


ROLES = ("search", "cost_model", "measurer")


def check_option_scopes(options: dict[str, Any], components: Sequence[str]) -> None:
    """Refuse what the Python API's ``options`` cannot mean: a scope that is neither a role nor one of the
    ``components`` the run uses (``{"serach": ...}``, ``{"ansor.population": 64}``), or one whose value is
    not a dict of keyword arguments."""
    for scope, values in options.items():
        if scope not in ROLES and scope not in components:
            raise UsageError(f"options[{scope!r}]: expected a role ({', '.join(ROLES)}) or a component of this run "
                             f"({', '.join(dict.fromkeys(components))}), each mapping keys to values, e.g. "
                             "{'search': {'population': 64}}")
        if not isinstance(values, dict):
            raise UsageError(f"options[{scope!r}] must be a dict of KEY: VALUE, not {values!r}")


def options_of(options: dict[str, dict[str, Any]], components: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The options of a run using ``components``: the role-wide ones and those components' own (a bench matrix
    has options for components a cell does not use)."""
    return {scope: values for scope, values in options.items() if scope in ROLES or scope in components}


def options_for(options: dict[str, dict[str, Any]] | None, role: str, name: str) -> dict[str, Any]:
    """The keyword arguments of the component ``name`` filling ``role``: role-wide, then its own."""
    options = options or {}
    return {**options.get(role, {}), **(options.get(name, {}) if name != role else {})}


def _parse_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def check_options(**checks: tuple[object, bool, str]) -> None:
    """Refuse bad option values (e.g. ``-O search.population=abc``) in a component's constructor, before any work.

    Each check is ``name=(value, acceptable, what it must be)``; TypeError is what tunecore turns
    into a one-line usage error.
    """
    for name, (value, acceptable, requirement) in checks.items():
        if not acceptable:
            raise TypeError(f"{name} must be {requirement}, not {value!r}")


def is_int(value: object, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def is_number(value: object, low: float, high: float = float("inf")) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high


def reject_unknown_options(label: str, name: str, options: dict[str, Any]) -> None:
    """Refuse option keys a component's constructor did not take (TypeError: a one-line usage error)."""
    if options:
        raise TypeError(f"unknown option(s) for {label} '{name}': {', '.join(sorted(options))}")
