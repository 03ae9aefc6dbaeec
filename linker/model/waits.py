"""The ``--waits`` choice, light to import: the command line checks it before linking and, after,
asks whether the output needs the wait step at all (``sim.file_waits``, which reads the output
back and replays it: heavy modules a CPU-only link never needs).

``measured`` (the default): the measured waits no dependency explains become wait nodes in the
output, and ``simulate`` replays them; ``explained``: left out, the graph's own prediction.
"""

from __future__ import annotations

from linker.model.errors import OptionError

MEASURED_WAITS, EXPLAINED_WAITS = "measured", "explained"
WAITS = (MEASURED_WAITS, EXPLAINED_WAITS)


def check_waits(value: str) -> str:
    """``value`` when it is a known ``--waits`` rule (``simulate``'s, and the link's and batch's);
    raises OptionError otherwise."""
    if value not in WAITS:
        raise OptionError(f"unknown --waits {value!r}; choose one of {', '.join(WAITS)}")
    return value


def wants_file_waits(outcome, waits: str) -> bool:
    """Whether the wait step has work on a link's output (``pipeline.PairOutcome``, its ``et_plus``
    still held): GPU or communication ops in the output (on CPU-only outputs the waits change no
    replay). Under either ``waits``: a kernel that waited for another stream's kernel gets its
    edge (``sim.device_edges``); the measured waits are written only under "measured". Raises
    OptionError on an unknown ``waits``."""
    check_waits(waits)
    return outcome.et_plus is not None and bool(outcome.et_plus.gpu_nodes)
