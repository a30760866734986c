"""Transfer-Tuning (Gibson & Cano, PACT'22) for tunecore: search policy `transfer`."""

from tunecore import hookimpl


@hookimpl
def tunecore_register_search_policies(register):
    from tunecore_transfer_tuning.search import TransferSearch

    register(TransferSearch)
