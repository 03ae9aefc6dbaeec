"""CPU/GPU clock skew as the trace itself shows it, and the blocking-copy rule that tolerates it.

Kineto stamps CPU events with the host clock and GPU ops with the GPU's, converted to host time;
the two disagree by tens of µs on real machines, and the disagreement drifts over a long trace. A
rule comparing a GPU op's time with a CPU call's must allow for it.

Estimate (``clock_skew``): every GPU op with a launch call gives a *launch gap*, GPU start minus
launch start. A launch gap is the launch latency (a few µs, never negative) plus the skew, plus any
time the op queued behind earlier work; so the smallest gaps of a stretch of the trace bound the
skew from above, by about the launch latency. That bound is what a rule *tolerating* the skew
needs (the blocking-copy rule below). A rule that *adds* the skew to a time (``plan.busy``'s
pre-trace lead) needs an estimate free of queueing: ``clock_skew(..., unqueued=True)`` keeps only
the ops that found their stream idle at the launch call, since in a GPU-bound stretch every op
queues and its gap mostly says how long. ``ClockSkew.at(t)``: the smallest launch gap among
the ``NEIGHBOURS`` launches nearest to time ``t`` on each side, never below 0 (local, so a skew
that drifts over the trace is followed; never negative, so a rule only ever becomes more tolerant
than with equal clocks). ``summary``: the smallest gap over the trace, the largest local estimate
and how many launches they rest on (the link report's ``simulation.clock_skew``).

Blocking copies (``blocking_copies``): a ``cudaMemcpy`` / ``hipMemcpy`` (synchronous by
definition), or a ``cudaMemcpyAsync`` / ``hipMemcpyAsync`` whose copy ended before the call
returned: on the trace's times, or once the GPU's times are read back by the local skew (copy end
− skew ≤ call end) for a copy longer than the skew (a shorter one cannot be placed against the
call's return by it: a small asynchronous copy ends a launch latency after its call, which the
skew estimate also holds) whose call lasted at least as long as the copy (as a call that returned
after its copy did). A copy
from or to pageable memory is synchronous in effect (the call stages it through a pinned buffer and
returns after the stream drained and the copy is done), and its copy ends a skew's worth after the
call returns on the trace's timeline. Such a copy is a wait for the stream (the ``sync`` edge from
the copy: the copy waited in stream order for the GPU work before it, the op after the call waits
for the copy) plus the staging time, which is the copy's own duration on the GPU timeline; the call
itself is blocked time of the CPU op holding it.

Cost: O(g log g) for g GPU ops with a launch (one sort of the launches), O(log g + NEIGHBOURS) per
asynchronous copy asked about.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

NEIGHBOURS = 16  # launches on each side of a time that its local skew estimate rests on
# Copies that are synchronous by definition (the call returns after the copy).
SYNC_COPY_CALLS = frozenset({"cudaMemcpy", "hipMemcpy", "cuMemcpy", "cuMemcpyDtoH", "cuMemcpyHtoD"})
# Copies that are asynchronous unless the copy finished before the call returned.
ASYNC_COPY_CALLS = frozenset({"cudaMemcpyAsync", "hipMemcpyAsync", "hipMemcpyWithStream", "cuMemcpyAsync"})


@dataclass
class ClockSkew:
    """Launch gaps (GPU start − launch start, µs) in launch-time order, for local estimates."""

    launch_ts: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)

    def at(self, t: float) -> float:
        """The skew to tolerate at host time ``t``: the smallest launch gap among the launches
        nearest to ``t`` (``NEIGHBOURS`` each side), at least 0; 0 without launches."""
        if not self.gaps:
            return 0.0
        p = bisect_left(self.launch_ts, t)
        return max(0.0, min(self.gaps[max(0, p - NEIGHBOURS):p + NEIGHBOURS]))

    def summary(self) -> dict:
        """``{"launches", "min_launch_gap_us", "max_local_us"}`` (µs, rounded to 0.1), for the report."""
        if not self.gaps:
            return {"launches": 0, "min_launch_gap_us": None, "max_local_us": None}
        step = NEIGHBOURS
        local = [max(0.0, min(self.gaps[max(0, p - step):p + step])) for p in range(0, len(self.gaps), step)]
        return {"launches": len(self.gaps), "min_launch_gap_us": round(min(self.gaps), 1),
                "max_local_us": round(max(local), 1)}


def clock_skew(gpu_links, unqueued: bool = False) -> ClockSkew:
    """The launch gaps of every GPU op with a launch call (module docstring). ``unqueued``: only
    those of ops that found their stream idle (``unqueued_links``), and none at all when fewer
    than ``NEIGHBOURS`` did (too few to tell a skew from a wait): the estimate for a rule that
    adds the skew to a measured time rather than tolerating it. O(g log g)."""
    links = unqueued_links(gpu_links) if unqueued else [link for link in gpu_links if link.launch is not None]
    if unqueued and len(links) < NEIGHBOURS:
        return ClockSkew()
    pairs = sorted((link.launch.ts, link.event.ts - link.launch.ts) for link in links)
    return ClockSkew([ts for ts, _ in pairs], [gap for _, gap in pairs])


def unqueued_links(gpu_links) -> list:
    """The links with a launch call whose GPU op's stream had finished its previous op by the
    call's start, on the trace's times (a GPU clock ahead makes the previous op's end look later:
    the test only ever drops more). A queued op's launch gap also holds its wait in the queue,
    which says nothing of the clocks: in a GPU-bound stretch every gap is mostly queueing.
    O(g log g)."""
    by_stream: dict = {}
    for link in gpu_links:
        event = link.event
        by_stream.setdefault((getattr(event, "pid", 0), getattr(event, "tid", 0)), []).append(link)
    kept = []
    for links in by_stream.values():
        links.sort(key=lambda link: link.event.ts)
        previous_end = float("-inf")
        for link in links:
            if link.launch is not None and previous_end <= link.launch.ts:
                kept.append(link)
            previous_end = max(previous_end, link.event.ts + link.event.dur)
    return kept


def is_blocking_copy(link, skew: ClockSkew | None = None) -> bool:
    """True when the GPU op's launch call blocked its thread until the copy was done (module
    docstring); ``skew`` None: equal clocks."""
    launch = link.launch
    if launch is None or link.event.cat != "gpu_memcpy":
        return False
    if launch.name in SYNC_COPY_CALLS:
        return True
    if launch.name not in ASYNC_COPY_CALLS:
        return False
    copy_end, call_end = link.event.ts + link.event.dur, launch.ts + launch.dur
    if copy_end <= call_end:
        return True
    if skew is None:
        return False
    tolerance = skew.at(launch.ts)
    # Only a copy longer than the skew can be placed against the call's return by it, and a call
    # that returned after its copy lasted at least as long as the copy.
    return (copy_end - tolerance <= call_end and link.event.dur > tolerance
            and launch.dur >= link.event.dur)


def blocking_copies(gpu_links, skew: ClockSkew) -> list[int]:
    """Indices (into ``gpu_links``) of the copies whose launch call blocked its thread. O(g)."""
    return [k for k, link in enumerate(gpu_links) if link.event.cat == "gpu_memcpy" and is_blocking_copy(link, skew)]
