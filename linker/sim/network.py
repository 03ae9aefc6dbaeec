"""Network what-ifs (``et-link simulate --network bandwidth=RATE[,latency=TIME][,medium=bus|links]``).

A collective's replayed time splits into what the network carries and what it does not (the
backend's CPU work, the wait for peers, a worker woken late). A what-if moves the first and keeps
the second as measured:

1. **Cost model** (``network_us``): a collective of S bytes among N ranks moves, per rank, the
   bytes of a ring algorithm (gloo's all-reduce is ``gloo::allreduce`` with no algorithm named,
   which is its ring: a reduce-scatter then an all-gather, each N - 1 steps; NCCL's default for
   large messages is a ring too): all-reduce 2(N-1)/N * S in 2(N-1) steps, reduce-scatter and
   all-to-all (N-1)/N * S in N-1 steps, all-gather and broadcast (N-1) * S and S in N-1 steps.
   On a **bus** (one medium every rank's traffic shares: a loopback slowed with ``tc ... tbf``, a
   single switch port) the time is every rank's bytes over the rate; on **links** (each rank its
   own link, as a NIC per GPU) one rank's bytes over the rate. Plus ``steps * latency``.
2. **Fit** (``fit_network``): the network part of the measured collectives is fitted to the
   trace's own collectives, per backend (CPU collectives: gloo, MPI, UCC; GPU collectives: NCCL,
   RCCL), by least squares on ``measured = steps * latency + medium_bytes / bandwidth``. What is
   measured for a collective is its group's transfer: for a CPU collective the longest of its
   members' parts after the last rank arrived (a part is its busy time less its measured wait for
   peers: docs/fidelity.md; the last rank to arrive sends all its bytes after it, one that arrived
   early may have sent some before, into its sockets), plus the parts the replay runs alone after
   it (a collective that ran under the previous one shares the medium with it: the two are one
   *episode* on the bus); for a GPU collective its shortest member. (Before 2026-11-30 each rank's
   own part: the slowed loopbacks' buses read 1.02–1.22 of the tbf rate, now 0.92–1.08.) When every episode has the same steps-to-bytes ratio (a DDP job sends the
   same buckets every step) latency and bandwidth are not told apart: the whole time is taken as
   bandwidth (latency 0), which the report says.
3. **Re-timing** (``retime``): each episode's replayed time becomes its measured time plus the
   change of its network part, ``network_us(given) - network_us(fitted)``: the given bandwidth,
   the given latency or else the fitted one. The change is applied to the episode's first
   collective and, where that would go below 0, to the next ones (never below 0). A collective
   that ran beside earlier ones (the rank's episode before it, or, for a later collective of an
   episode, the ones before it there) spent part of that time communicating, held in its pickup
   by the replay (``engine.CommGroups.shared``, which ends where they ended): the part that lies
   within their measured parts (their time after the last arrival) stretches as they did, so
   that it ends where they now end; the part before (their wait for peers) is kept. (Until
   2026-11-30 the whole of it moved by the episode's factor, its new time over its measured one:
   a gloo worker that took the second all-reduce of a step before the first's last member
   arrived counted that wait with it, and predicting 4 ranks at 500 Mbit/s from their unlimited
   loopback, the second ended 19-110 ms after the first's new end on the steps where that
   happened: +12.3% on average over 16 pairs of captures, +7.1% now.) Beyond these,
   matching, pickups and waits are the replay's own.

A send's or receive's transfer (a pipeline's stages: docs/durations.md, "Sends and receives on
the CPU") is one step of its bytes, which cross the medium once (bus or links); its measured part
is what the replay holds it for after the other side arrived, as a collective's. On a CPU backend
the receive holds the transfer: a gloo send returns once its bytes are in the socket's buffers
(on a 2-rank pipeline slowed to 200 Mbit/s: sends of 1 MB took 0.1 ms, their receives 31.5 ms
after the send began, (1 MB - tbf's 256 KB burst) / 25 MB/s), so the send keeps its measured time
and only the receive is fitted and moved; a GPU transfer's kernels (both sides) move alike. A
transfer the replay does not pair (one rank's file) keeps its time.

Collective types without a volume rule (barrier, unknown) keep their measured time. Cost:
O(collectives) for the fit and the re-timing (one pass over each rank's collectives, sorted by
issue order: O(c log c)).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from linker.model.errors import OptionError
from linker.sim.graph import COLL, SEND

# Chakra CollectiveCommType numbers (et_def.proto; graph.COMM_TYPE_NAMES).
ALL_REDUCE, REDUCE, ALL_GATHER, GATHER, SCATTER, BROADCAST, ALL_TO_ALL, REDUCE_SCATTER = range(8)
# A send's and a receive's transfer, in the places a collective type goes (no Chakra number).
SEND_TRANSFER, RECV_TRANSFER = -2, -3
MODELLED_TYPES = {ALL_REDUCE: "ALL_REDUCE", ALL_GATHER: "ALL_GATHER", BROADCAST: "BROADCAST",
                  ALL_TO_ALL: "ALL_TO_ALL", REDUCE_SCATTER: "REDUCE_SCATTER", SEND_TRANSFER: "SEND",
                  RECV_TRANSFER: "RECV"}
BUS, LINKS = "bus", "links"
MEDIA = (BUS, LINKS)
# Which medium a backend's collectives are taken to share unless ``medium=`` says otherwise: CPU
# collectives of one job run between processes that share a host's network stack (all ranks on
# one loopback, or one NIC per host); GPU collectives each over their own link.
DEFAULT_MEDIUM = {"cpu": BUS, "gpu": LINKS}

# Rate units: the factor to bytes per second. Decimal prefixes (network rates are decimal; tc's
# "1gbit" is 10^9 bit/s), binary ones where the name says so (KiB, MiB, GiB).
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_BINARY = {"ki": 2.0 ** 10, "mi": 2.0 ** 20, "gi": 2.0 ** 30, "ti": 2.0 ** 40}
_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*(?:(/\s*s|ps))?\s*$", re.IGNORECASE)
_TIME_UNITS = {"ns": 1e-3, "us": 1.0, "µs": 1.0, "μs": 1.0, "ms": 1e3, "s": 1e6}
_TIME = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-zµμ]*)\s*$", re.IGNORECASE)


def parse_rate(text: str) -> float:
    """A link rate as people write it -> bytes per second: ``800Mbit/s``, ``2Gbit/s``, ``1gbit``
    (tc's spelling), ``100MB/s``, ``25GB/s``, ``1.5GiB/s``. Bits are ``bit``/``b``, bytes ``B``
    (or ``byte``); ``bps``-style names (``Mbps``) are refused: tc reads them as bytes, most people
    as bits. Raises OptionError with the reason on anything else."""
    match = _RATE.match(text)
    if not match:
        raise OptionError(f"bad --network bandwidth {text!r}: write a rate such as 800Mbit/s, 2Gbit/s, 100MB/s, 25GB/s")
    number, unit, per_second = match.group(1), match.group(2), match.group(3) or ""
    if per_second.lower() == "ps" or unit.lower().endswith("bps"):
        raise OptionError(f"bad --network bandwidth {text!r}: 'bps' is ambiguous (bits or bytes); write "
                          f"Mbit/s or MB/s")
    value = float(number)
    lowered = unit.lower()
    if lowered.endswith("bit") or lowered.endswith("bits"):
        stem, per_byte = lowered[:lowered.rindex("bit")], 1 / 8
    elif lowered.endswith("byte") or lowered.endswith("bytes"):
        stem, per_byte = lowered[:lowered.rindex("byte")], 1.0
    elif unit.endswith("B"):
        stem, per_byte = lowered[:-1], 1.0
    elif unit.endswith("b"):
        stem, per_byte = lowered[:-1], 1 / 8
    else:
        raise OptionError(f"bad --network bandwidth {text!r}: say bits or bytes (Gbit/s, GB/s)")
    factor = _BINARY.get(stem, _PREFIX.get(stem))
    if factor is None:
        raise OptionError(f"bad --network bandwidth {text!r}: unknown prefix {stem!r} (k, M, G, T, Ki, Mi, Gi)")
    rate = value * factor * per_byte
    if not (rate > 0 and math.isfinite(rate)):
        raise OptionError(f"bad --network bandwidth {text!r}: must be a positive rate")
    return rate


def parse_latency(text: str) -> float:
    """A latency -> µs: ``50us``, ``1ms``, ``200ns``, ``0``, ``0.5 ms``. Raises OptionError."""
    match = _TIME.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or (unit and unit not in _TIME_UNITS) or (not unit and float(match.group(1)) != 0):
        raise OptionError(f"bad --network latency {text!r}: write a time such as 50us, 1ms, 200ns (or 0)")
    value = float(match.group(1)) * (_TIME_UNITS[unit] if unit else 1.0)
    if not math.isfinite(value):
        raise OptionError(f"bad --network latency {text!r}: must be finite")
    return value


def format_rate(bytes_per_second: float) -> str:
    """Bytes per second in bits as a link is named: "1 Gbit/s", "812.3 Mbit/s"."""
    bits = bytes_per_second * 8
    for factor, name in ((1e12, "Tbit/s"), (1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")):
        if bits >= factor:
            return f"{bits / factor:.4g} {name}"
    return f"{bits:.4g} bit/s"


@dataclass(frozen=True)
class NetworkSpec:
    """The link a what-if asks about: bandwidth (bytes/s), latency (µs; None: as fitted), medium
    (``bus`` / ``links``; None: ``DEFAULT_MEDIUM`` per backend)."""

    bandwidth: float
    latency_us: float | None = None
    medium: str | None = None

    @classmethod
    def parse(cls, text: str) -> "NetworkSpec":
        """``"bandwidth=1Gbit/s,latency=50us,medium=bus"`` (bandwidth required). Raises OptionError."""
        given: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, sep, value = item.partition("=")
            name = name.strip().lower()
            if not sep or name not in ("bandwidth", "latency", "medium") or name in given:
                raise OptionError(f"bad --network item {item!r}: use bandwidth=RATE[,latency=TIME][,medium=bus|links]")
            given[name] = value.strip()
        if "bandwidth" not in given:
            raise OptionError("--network needs bandwidth=RATE (e.g. bandwidth=1Gbit/s,latency=50us)")
        medium = given.get("medium")
        if medium is not None and medium.lower() not in MEDIA:
            raise OptionError(f"bad --network medium {medium!r}: choose bus or links")
        return cls(parse_rate(given["bandwidth"]),
                   parse_latency(given["latency"]) if "latency" in given else None,
                   medium.lower() if medium else None)

    def to_json(self) -> dict:
        return {"bandwidth_bytes_per_s": self.bandwidth, "bandwidth": format_rate(self.bandwidth),
                "latency_us": self.latency_us, "medium": self.medium}


def volume(comm_type: int, size: int, npus: int) -> tuple[int, float] | None:
    """(steps, bytes one rank sends) of a ring collective of ``size`` bytes among ``npus`` ranks;
    for a send's or receive's transfer (``SEND_TRANSFER``, ``RECV_TRANSFER``, ``npus`` 1: one
    transfer's bytes cross the medium once, bus or links) one step of ``size``; None for a type
    without a volume rule."""
    if comm_type in (SEND_TRANSFER, RECV_TRANSFER):
        return 1, float(size)
    n = max(npus, 1)
    if n < 2:
        return 0, 0.0
    if comm_type == ALL_REDUCE:
        return 2 * (n - 1), 2 * (n - 1) / n * size
    if comm_type in (REDUCE_SCATTER, ALL_TO_ALL):
        return n - 1, (n - 1) / n * size
    if comm_type == ALL_GATHER:
        return n - 1, (n - 1) * size
    if comm_type == BROADCAST:
        return n - 1, float(size)
    return None


def medium_bytes(per_rank: float, npus: int, medium: str) -> float:
    """The bytes that pass the bottleneck: every rank's on a bus, one rank's on links."""
    return per_rank * max(npus, 1) if medium == BUS else per_rank


def network_us(steps: int, bytes_on_medium: float, bandwidth: float, latency_us: float) -> float:
    """The network part of one collective: ``steps * latency + bytes / bandwidth`` (µs; bandwidth
    in bytes/s, ``math.inf`` for none)."""
    return steps * latency_us + (bytes_on_medium / bandwidth * 1e6 if bandwidth < math.inf else 0.0)


@dataclass
class Episode:
    """One rank's run of collectives the replay holds back to back: a collective (``nodes[0]``,
    matched across ranks or alone) and the ones after it on the same rank and group that the
    replay runs alone (they ran under it, sharing the medium). ``measured_us``: what the replay
    holds them for (the first's part after the last arrival, the others' durations);
    ``parts[k]``: that part of ``nodes[k]``. ``transfer_us``: what the fit reads, the same but for
    a matched CPU collective first, whose part is its group's transfer, the longest of its members'
    parts after the last arrival (``group_extra``: that, less this rank's part): the last rank to
    arrive sends all its bytes after it, while one that arrived early may have sent some before,
    into its sockets, and its part after the last arrival is shorter."""

    backend: str
    rank: int
    pg: str
    nodes: list[int]
    parts: list[float]
    steps: int = 0
    per_rank_bytes: float = 0.0
    npus: int = 1
    types: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    group_extra: float = 0.0
    beside: "Episode | None" = None  # the rank's open episode of the same group when this one began
    parts_now: list[float] = field(default_factory=list)  # ``parts`` once a what-if re-timed them (``retime``)

    @property
    def measured_us(self) -> float:
        return sum(self.parts)

    @property
    def transfer_us(self) -> float:
        return sum(self.parts) + self.group_extra


@dataclass
class FittedNetwork:
    """The network that reproduces one backend's measured episodes."""

    backend: str  # "cpu" or "gpu"
    medium: str
    bandwidth: float  # bytes/s (math.inf: the times do not grow with the bytes)
    latency_us: float
    episodes: int
    collectives: int
    latency_told_apart: bool  # False: one steps-to-bytes ratio; the whole time taken as bandwidth
    measured_us: float
    modelled_us: float
    mean_abs_error: float  # mean |model - measured| / measured over the episodes

    def to_json(self) -> dict:
        return {"backend": self.backend, "medium": self.medium,
                "bandwidth_bytes_per_s": None if self.bandwidth == math.inf else round(self.bandwidth, 1),
                "bandwidth": format_rate(self.bandwidth) if self.bandwidth < math.inf else "unbounded",
                "latency_us": round(self.latency_us, 3), "latency_told_apart": self.latency_told_apart,
                "episodes": self.episodes, "collectives": self.collectives,
                "measured_us": round(self.measured_us, 3), "modelled_us": round(self.modelled_us, 3),
                "mean_abs_error": round(self.mean_abs_error, 4)}


def fit_network(episodes: list[Episode], backend: str, medium: str) -> FittedNetwork | None:
    """Least squares of ``transfer = steps * latency + bytes / bandwidth`` over ``episodes``
    (``Episode.transfer_us``; latency >= 0, bandwidth > 0); None without an episode that carries bytes. When the episodes
    cannot tell latency from bandwidth (one steps-to-bytes ratio, or a negative latency fitted)
    latency is 0 and the bandwidth reproduces the total. O(episodes)."""
    rows = [(e.steps, medium_bytes(e.per_rank_bytes, e.npus, medium), e.transfer_us) for e in episodes
            if e.per_rank_bytes > 0]
    if not rows:
        return None
    saa = sum(a * a for a, _, _ in rows)
    sab = sum(a * b for a, b, _ in rows)
    sbb = sum(b * b for _, b, _ in rows)
    sat = sum(a * t for a, _, t in rows)
    sbt = sum(b * t for _, b, t in rows)
    total_bytes, total_us = sum(b for _, b, _ in rows), sum(t for _, _, t in rows)
    det = saa * sbb - sab * sab
    latency, per_byte, told_apart = 0.0, total_us / total_bytes, False  # µs per byte
    if det > 1e-9 * saa * sbb:
        lat, inv = (sat * sbb - sbt * sab) / det, (saa * sbt - sab * sat) / det
        if lat >= 0 and inv > 0:
            latency, per_byte, told_apart = lat, inv, True
    if per_byte <= 0:  # the times do not grow with the bytes: all of it is latency
        steps = sum(a for a, _, _ in rows)
        latency, per_byte = (total_us / steps if steps else 0.0), 0.0
    bandwidth = 1e6 / per_byte if per_byte > 0 else math.inf
    modelled = [network_us(a, b, bandwidth, latency) for a, b, _ in rows]
    errors = [abs(m - t) / t for m, (_, _, t) in zip(modelled, rows) if t > 0]
    return FittedNetwork(backend, medium, bandwidth, latency, len(rows), sum(len(e.nodes) for e in episodes),
                         told_apart, total_us, sum(modelled), sum(errors) / len(errors) if errors else 0.0)


@dataclass
class CollectiveChange:
    """The what-if's change for one kind of collective (``--explain``-style attribution)."""

    backend: str
    process_group: str
    comm_type: str
    bytes: int
    npus: int
    count: int = 0  # collectives over all ranks
    measured_network_us: float = 0.0  # the fitted network part, summed over ranks
    what_if_network_us: float = 0.0

    def to_json(self) -> dict:
        return {"backend": self.backend, "process_group": self.process_group, "comm_type": self.comm_type,
                "bytes": self.bytes, "npus": self.npus, "count": self.count,
                "measured_network_us": round(self.measured_network_us, 3),
                "what_if_network_us": round(self.what_if_network_us, 3),
                "change_us": round(self.what_if_network_us - self.measured_network_us, 3)}


@dataclass
class NetworkWhatIf:
    """What ``retime`` did: the link asked about, the fitted network per backend, the change per
    kind of collective, and the notes (what kept its measured time, and why)."""

    given: NetworkSpec
    fitted: list[FittedNetwork] = field(default_factory=list)
    changes: list[CollectiveChange] = field(default_factory=list)
    retimed: int = 0  # collective nodes whose time moved
    kept: int = 0  # collective nodes kept as measured (no volume rule, no fit)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        measured = sum(c.measured_network_us for c in self.changes)
        what_if = sum(c.what_if_network_us for c in self.changes)
        return {"given": self.given.to_json(), "fitted": [f.to_json() for f in self.fitted],
                "retimed_collectives": self.retimed, "kept_collectives": self.kept,
                "measured_network_us": round(measured, 3), "what_if_network_us": round(what_if, 3),
                "change_us": round(what_if - measured, 3),
                "by_collective": [c.to_json() for c in self.changes], "notes": self.notes}

    def lines(self) -> list[str]:
        """The report's text lines."""
        given = self.given
        latency = "as fitted" if given.latency_us is None else f"{given.latency_us:g} us"
        out = [f"network what-if: bandwidth {format_rate(given.bandwidth)}, latency {latency}"
               + (f", medium {given.medium}" if given.medium else "")]
        for fit in self.fitted:
            told = "" if fit.latency_told_apart else " (one message mix: latency not told apart, all taken as bandwidth)"
            bandwidth = format_rate(fit.bandwidth) if fit.bandwidth < math.inf else "unbounded"
            out.append(f"  measured network of the {fit.backend} collectives ({fit.medium}): {bandwidth}, latency "
                       f"{fit.latency_us:,.1f} us{told}; fitted to {fit.collectives} collectives in {fit.episodes} "
                       f"episodes, {100 * fit.mean_abs_error:.1f}% mean error")
        measured = sum(c.measured_network_us for c in self.changes)
        what_if = sum(c.what_if_network_us for c in self.changes)
        out.append(f"  {self.retimed} collective(s) re-timed: network time {measured / 1000:,.2f} ms as measured -> "
                   f"{what_if / 1000:,.2f} ms on the given link (summed over ranks; the rest of their time is "
                   f"kept as measured)" + (f"; {self.kept} kept as measured" if self.kept else ""))
        for change in sorted(self.changes, key=lambda c: -abs(c.what_if_network_us - c.measured_network_us))[:5]:
            out.append(f"    {change.backend} {change.comm_type} {change.bytes:,} B x{change.count} on process group "
                       f"{change.process_group}: {(change.what_if_network_us - change.measured_network_us) / 1000:+,.2f} ms")
        out += [f"  note: {note}" for note in self.notes]
        return out


def _is_cpu(graph, u: int) -> bool:
    return graph.lane_keys[graph.lane[u]][0] == "cpu"


def _issue_order(graph, u: int) -> tuple:
    """The replay's issue order of a collective on its rank (``engine._issue_key``): GPU ones by
    measured start, CPU ones (after them) by id (``_in_issue_order`` puts the numbered ones in
    number order)."""
    if _is_cpu(graph, u):
        return (1, graph.ids[u], graph.ids[u])
    start = graph.start[u]
    return (0, start if not math.isnan(start) else math.inf, graph.ids[u])


def _in_issue_order(graph) -> list[int]:
    """A rank's communication nodes in issue order (``_issue_order``), its CPU collectives that
    carry an issue number (``comm_seq``) in number order among the places they hold: an id is
    given when a worker starts the record, and two workers that start within µs can take theirs
    against their issue (``plan.cpu_comm.issue_order``). O(c log c)."""
    order = sorted(graph.comm, key=lambda u: _issue_order(graph, u))
    places = [k for k, u in enumerate(order) if _is_cpu(graph, u) and graph.comm[u].seq is not None]
    for k, u in zip(places, sorted((order[k] for k in places), key=lambda u: graph.comm[u].seq)):
        order[k] = u
    return order


def _episodes(graphs, offsets: list[int], groups, duration, comm_factor: float) -> tuple[list[Episode], int]:
    """Every rank's episodes (see ``Episode``) and the count of collective nodes left as measured
    (no volume rule, or a group of unknown size: a single rank's file). O(c log c) for c
    collective nodes."""
    episodes: list[Episode] = []
    kept = 0
    pg_size: dict[str, int] = {}  # a process group's size, from its matched collectives
    member_index: dict[int, int] = {}  # a matched node -> its place among its group's members
    transfer: dict[int, float] = {}  # group -> its shortest member's duration, once per group
    for members, label in zip(groups.members, groups.label):
        pg_size.setdefault(label[0], len(members))
        member_index.update((u, k) for k, u in enumerate(members))
    for r, (graph, base) in enumerate(zip(graphs, offsets)):
        current: dict[tuple[str, str], Episode] = {}  # (backend, pg) -> the open episode
        for u in _in_issue_order(graph):
            info = graph.comm[u]
            v = base + u
            g = groups.group_of[v]
            if info.role == SEND and _is_cpu(graph, u):
                continue  # handing the bytes to the transport: its receive holds the transfer
            if info.role != COLL:  # a send's or receive's transfer, matched with its other side
                comm_type, npus = (SEND_TRANSFER if info.role == SEND else RECV_TRANSFER), 1
            else:
                comm_type = info.comm_type
                npus = len(groups.members[g]) if g >= 0 else pg_size.get(info.pg_name, 1)
            shape = volume(comm_type, info.size, npus)
            if shape is None or (npus < 2 if info.role == COLL else g < 0):
                kept += 1
                continue
            backend = "cpu" if _is_cpu(graph, u) else "gpu"
            part, group_part = duration[v], None
            if g >= 0:
                waits = groups.waited.get(g)
                if waits is not None:  # CPU collectives on one clock: parts after the last arrival
                    after_last = [max(0.0, duration[m] - w * comm_factor) for m, w in zip(groups.members[g], waits)]
                    part, group_part = after_last[member_index[v]], max(after_last)
                else:  # clocks disagree: the group's transfer, its shortest member (engine.replay)
                    part = transfer.get(g)
                    if part is None:
                        part = transfer[g] = min(duration[m] for m in groups.members[g])
            key = (backend, info.pg_name)
            episode = current.get(key)
            if g >= 0 or episode is None or backend == "gpu":
                episode = current[key] = Episode(backend, graph.rank, info.pg_name, [], [], npus=npus,
                                                 beside=episode)
                episodes.append(episode)
                if group_part is not None:
                    episode.group_extra = group_part - part
            episode.nodes.append(v)
            episode.parts.append(part)
            episode.steps += shape[0]
            episode.per_rank_bytes += shape[1]
            episode.types.append(comm_type)
            episode.sizes.append(info.size)
    return episodes, kept


@dataclass
class JobNetwork:
    """The measured network of a job: each backend's episodes and their fit (None: its collectives
    carry no bytes), and the collective nodes no episode holds (``kept``)."""

    episodes: dict[str, list[Episode]]
    fits: dict[str, FittedNetwork | None]
    kept: int


def fit_job(graphs, offsets: list[int], groups, duration, comm_factor: float = 1.0,
            medium: str | None = None) -> JobNetwork:
    """Fit each backend's network (``fit_network``) to the job's episodes (``groups``: the replay's
    ``CommGroups``, ``engine.match_communication``; ``duration``: global node durations) on
    ``medium`` (None: ``DEFAULT_MEDIUM`` per backend). Nothing is changed. O(c log c)."""
    episodes, kept = _episodes(graphs, offsets, groups, duration, comm_factor)
    by_backend = {backend: [e for e in episodes if e.backend == backend] for backend in ("cpu", "gpu")}
    by_backend = {backend: mine for backend, mine in by_backend.items() if mine}
    fits = {backend: fit_network(mine, backend, medium or DEFAULT_MEDIUM[backend]) for backend, mine in by_backend.items()}
    return JobNetwork(by_backend, fits, kept)


def retime(graphs, offsets: list[int], groups, duration, comm_factor: float, spec: NetworkSpec) -> NetworkWhatIf:
    """Re-time the collectives of a job for ``spec`` in place (``duration``, global node numbers;
    ``groups``: the replay's ``CommGroups``): fit each backend's network to its episodes, then add
    to each episode the change of its network part. Returns what was done. O(c log c)."""
    result = NetworkWhatIf(spec)
    job = fit_job(graphs, offsets, groups, duration, comm_factor, spec.medium)
    result.kept = job.kept
    changes: dict[tuple, CollectiveChange] = {}
    for backend, mine in job.episodes.items():
        fit = job.fits[backend]
        if fit is None:
            result.notes.append(f"the {backend} collectives carry no bytes: kept as measured")
            result.kept += sum(len(e.nodes) for e in mine)
            continue
        result.fitted.append(fit)
        medium = fit.medium
        latency = fit.latency_us if spec.latency_us is None else spec.latency_us
        for episode in mine:
            change = 0.0
            for v, comm_type, size in zip(episode.nodes, episode.types, episode.sizes):
                steps, per_rank = volume(comm_type, size, episode.npus)
                on_medium = medium_bytes(per_rank, episode.npus, medium)
                before = network_us(steps, on_medium, fit.bandwidth, fit.latency_us)
                after = network_us(steps, on_medium, spec.bandwidth, latency)
                change += after - before
                key = (backend, episode.pg, comm_type, size, episode.npus)
                row = changes.get(key)
                if row is None:
                    row = changes[key] = CollectiveChange(backend, episode.pg, MODELLED_TYPES[comm_type], size,
                                                          episode.npus)
                row.count += 1
                row.measured_network_us += before
                row.what_if_network_us += after
            was = [duration[v] for v in episode.nodes]
            _apply(episode, change, duration)
            episode.parts_now = [part + duration[v] - d for v, part, d in zip(episode.nodes, episode.parts, was)]
            result.retimed += len(episode.nodes)
        for episode in mine:
            _move_shared(episode, groups)
    result.changes = sorted(changes.values(), key=lambda c: (c.backend, c.process_group, c.comm_type, c.bytes))
    if result.kept:
        result.notes.append(f"{result.kept} collective node(s) kept as measured: a type without a volume rule, or "
                            f"a group whose size the files do not tell (one rank's file alone)")
    return result


def _move_shared(episode: Episode, groups) -> None:
    """Move the time each collective of ``episode`` communicated beside earlier ones
    (``groups.shared``, which ends where they ended) with their re-timing: the first collective
    ran beside the rank's episode before it (``Episode.beside``), a later one beside the ones
    before it in this episode. Of its time, the part within their measured parts (their time
    after the last arrival) is stretched as they were (``Episode.parts_now`` over ``parts``), so that
    it ends where they now end; the part before (their wait for peers) is kept. O(len(episode))."""
    beside = episode.beside
    earlier = (beside.measured_us, sum(beside.parts_now)) if beside is not None else (0.0, 0.0)
    ran, ran_now = 0.0, 0.0  # this episode's parts before the node, measured and re-timed
    for k, (v, part, new_part) in enumerate(zip(episode.nodes, episode.parts, episode.parts_now)):
        measured, now = earlier if k == 0 else (ran, ran_now)
        within = min(groups.shared.get(v, 0.0), measured)
        if within > 0:
            groups.resize_shared(v, groups.shared[v] - within + within * now / measured)
        ran, ran_now = ran + part, ran_now + new_part


def _apply(episode: Episode, change: float, duration) -> None:
    """Add ``change`` µs to the episode: to its first node's part, the rest (where a part would go
    below 0) to the next nodes'. A matched GPU collective's transfer is its members' shortest
    duration, so each member moves by the same amount (``change`` is the same on every rank)."""
    for v, part in zip(episode.nodes, episode.parts):
        step = max(change, -part)
        duration[v] = max(0.0, duration[v] + step)
        change -= step
        if change >= 0:
            break
