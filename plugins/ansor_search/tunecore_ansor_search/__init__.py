"""Ansor (Zheng et al., OSDI'20) for tunecore: search policy `ansor` and cost model `xgb`."""

from tunecore import hookimpl


def check_options(**checks: tuple[object, bool, str]) -> None:
    """Refuse bad option values (e.g. ``-O search.population=abc``) at construction, before any work.

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


@hookimpl
def tunecore_register_search_policies(register):
    from tunecore_ansor_search.evolution import AnsorSearch

    register(AnsorSearch)


@hookimpl
def tunecore_register_cost_models(register):
    from tunecore_ansor_search.xgb import XGBModel

    register(XGBModel)
