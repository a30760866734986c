"""CDMPP (Liu et al., EuroSys'24) for tunecore: cost model `cdmpp` and the commands `tunecore cdmpp train|adapt`.

torch is imported only when the cost model or a command is used, never on plugin load: build
workers load plugins too.
"""

from tunecore import hookimpl


@hookimpl
def tunecore_register_cost_models(register):
    from tunecore_cdmpp_predictor.costmodel import CDMPPModel

    register(CDMPPModel)


@hookimpl
def tunecore_register_commands(register):
    from tunecore_cdmpp_predictor.cli import add_commands

    add_commands(register)
