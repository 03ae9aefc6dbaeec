"""What the machine has: the memory a process may still take. Plain reads, no state.

``available_memory_bytes`` is what the batch plans its workers by and what bounds how far an input
may inflate (``read.files.inflate_limit``). Cost: one read of /proc/meminfo.
"""

from __future__ import annotations


def available_memory_bytes() -> int | None:
    """``MemAvailable`` from /proc/meminfo, or None where there is none."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
