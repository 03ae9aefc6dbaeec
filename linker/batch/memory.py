"""How much memory a rank needs and how much the machine has: the local runner's admission model.

Cost: O(1) per file (size and gzip trailer), one read of /proc/meminfo.
"""

from __future__ import annotations

import os
from pathlib import Path

from linker.model.machine import available_memory_bytes  # noqa: F401 (re-exported: the batch plans by it)
from linker.read.files import GZIP_MAGIC, plausible_gzip_size

# --- memory model -------------------------------------------------------------------------------
# Peak RSS of one rank ~= PEAK_BASE_BYTES + PEAK_BYTES_PER_INPUT_BYTE * (uncompressed ET + Kineto
# bytes). Measured with ``scripts/bench_batch.py --memory`` (fresh process per pair, ru_maxrss minus
# the RSS after imports, 18 MB), (peak - base) / input:
#   param_dlrm rank 0 (1.7 MB of JSON): 25 MB peak, 3.99;  param_linear (21.5 MB): 105 MB, 4.22;
#   transformer 12 layers x 12 steps (135k ET nodes, 196 MB): 606 MB, 3.14;
#   transformer 48 layers x 8 steps (361k ET nodes, 524 MB): 1,536 MB, 3.04.
# The factor is the largest ratio plus ~25% (an underestimate risks the OOM killer, an overestimate
# only costs parallelism); the base covers the interpreter, the imports and, for forked local
# workers, the parent's pages (34 MB measured).
PEAK_BASE_BYTES = 48 << 20
PEAK_BYTES_PER_INPUT_BYTE = 5.3
# Peak RSS of working on one output after the links ~= PEAK_BASE_BYTES + a factor times its
# uncompressed bytes: rewriting it for its rank start (``batch.rank_start``: a 417 MB ET+ JSON
# spliced in 639 MB) and reading it back as a replay graph (``sim.load``: a 220 MB ``.et`` of 360k
# nodes in 634 MB).
REWRITE_BYTES_PER_OUTPUT_BYTE = 1.6
GRAPH_BYTES_PER_OUTPUT_BYTE = 3.0
# Share of MemAvailable the local runner plans to use (the rest is left to the system).
MEMORY_BUDGET_SHARE = 0.85
# gzip stores the uncompressed size modulo 2**32; for big files the wrap count is estimated from
# this typical JSON trace compression ratio (measured 16-28x on the traces here).
TYPICAL_GZIP_RATIO = 18.0


def uncompressed_size(path: Path) -> int:
    """Bytes after gunzip (gzip trailer ISIZE, wrap count estimated past 4 GiB), else file size. O(1)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if f.read(2) != GZIP_MAGIC or size < 20:
            return size
        f.seek(-4, os.SEEK_END)
        isize = int.from_bytes(f.read(4), "little")
    if size * TYPICAL_GZIP_RATIO < (1 << 32):
        # A truncated file ends in arbitrary bytes: an impossible ratio falls back to the typical one.
        return isize if plausible_gzip_size(size, isize) else int(size * TYPICAL_GZIP_RATIO)
    wraps = max(round((size * TYPICAL_GZIP_RATIO - isize) / (1 << 32)), 0)
    return isize + wraps * (1 << 32)


def estimate_peak_bytes(input_bytes: int) -> int:
    """Expected peak RSS of a rank from its uncompressed input bytes (see the memory model)."""
    return int(PEAK_BASE_BYTES + PEAK_BYTES_PER_INPUT_BYTE * input_bytes)


def estimate_output_work_bytes(output_bytes: int, per_output_byte: float) -> int:
    """Expected peak RSS of working on an output of ``output_bytes`` uncompressed bytes, at
    ``per_output_byte`` (``REWRITE_BYTES_PER_OUTPUT_BYTE``, ``GRAPH_BYTES_PER_OUTPUT_BYTE``)."""
    return int(PEAK_BASE_BYTES + per_output_byte * output_bytes)
