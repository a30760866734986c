"""TLM (Zhai et al., OSDI'24) for tunecore: search policy `tlm` and the commands `tunecore tlm pretrain|finetune`.

torch is imported only when the policy or a command is used, never on plugin load: build workers
load plugins too.
"""

from tunecore import hookimpl


@hookimpl
def tunecore_register_search_policies(register):
    from tunecore_tlm_generator.search import TLMSearch

    register(TLMSearch)


@hookimpl
def tunecore_register_commands(register):
    from tunecore_tlm_generator.cli import add_commands

    add_commands(register)
