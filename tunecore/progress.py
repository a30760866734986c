"""How a long job (collecting, profiling, training) says where it is: one type for every such job, so that one
display shows any of them (tunecore.cli.render.tracker) and a Python caller reads them alike."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Progress:
    """``done`` of ``total`` steps (None: not known yet) of the job's current ``stage`` (e.g. "measuring on
    AMD EPYC (znver4, 1 cores)", "training"), the ``item`` it works on (a task's name, or ""), and where they apply,
    the items that ``failed`` and the last training ``loss``."""

    stage: str
    done: int
    total: int | None
    item: str = ""
    failed: int = 0
    loss: float | None = None
