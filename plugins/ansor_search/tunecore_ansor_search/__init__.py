"""Ansor (Zheng et al., OSDI'20) for tunecore: search policy `ansor` and cost model `xgb`."""

from tunecore import hookimpl


@hookimpl
def tunecore_register_search_policies(register):
    from tunecore_ansor_search.evolution import AnsorSearch

    register(AnsorSearch)


@hookimpl
def tunecore_register_cost_models(register):
    from tunecore_ansor_search.xgb import XGBModel

    register(XGBModel)
