"""A cost model on hardware-profile metrics (after summerspringwei/tvm_oraa's Nsight Compute study) for tunecore:
profilers `cpu` (callgrind + llvm-mca) and `ncu` (Nsight Compute), cost model `ncu`, command `tunecore ncu profile`.
"""

from tunecore import hookimpl


@hookimpl
def tunecore_register_profilers(register):
    from tunecore_ncu_costmodel.profilers import CPUProfiler, NcuProfiler

    register(CPUProfiler)
    register(NcuProfiler)


@hookimpl
def tunecore_register_cost_models(register):
    from tunecore_ncu_costmodel.model import NcuModel

    register(NcuModel)


@hookimpl
def tunecore_register_commands(register):
    from tunecore_ncu_costmodel.cli import add_commands

    add_commands(register)
