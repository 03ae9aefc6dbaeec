"""Network what-ifs (``et-link simulate --network``, linker/sim/network.py): the rate and latency
parser, the cost model and its fit on hand-written graphs, and a real what-if: a 2-rank DDP job
over gloo captured at an unlimited loopback and at ``tbf rate 1gbit``, each predicted from the
other (tests/fixtures/whatif, docs/whatif.md)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from linker.model import et_def_pb2 as pb
from linker.model.errors import OptionError
from linker.sim.engine import ASTRA_SIM, measured_release, replay
from linker.sim.load import load_graph
from linker.sim.network import NetworkSpec, network_us, parse_latency, parse_rate, volume
from linker.write.chakra_wire import make_attr
from sim_graphs import Spec, cpu, write_et

FIXTURES = Path(__file__).parent / "fixtures" / "whatif"


@pytest.mark.parametrize("text, bytes_per_second", [
    ("800Mbit/s", 100e6), ("2Gbit/s", 250e6), ("1gbit", 125e6), ("500mbit", 62.5e6), ("100MB/s", 100e6),
    ("25GB/s", 25e9), ("1.5 GiB/s", 1.5 * 2 ** 30), ("10 kbit/s", 1250.0), ("1e9 bit/s", 125e6),
    ("64 bytes/s", 64.0), ("8b/s", 1.0)])
def test_rates_as_people_write_them(text, bytes_per_second):
    assert parse_rate(text) == pytest.approx(bytes_per_second)


@pytest.mark.parametrize("text", ["", "fast", "10", "1Gbps", "100 Mbps", "-1Gbit/s", "0MB/s", "2Xbit/s", "1G"])
def test_bad_rates_are_one_line_option_errors(text):
    with pytest.raises(OptionError) as err:
        parse_rate(text)
    assert "\n" not in str(err.value) and "bandwidth" in str(err.value)


@pytest.mark.parametrize("text, us", [("50us", 50.0), ("1ms", 1000.0), ("200ns", 0.2), ("0", 0.0), ("0.5 ms", 500.0),
                                      ("2s", 2e6), ("3µs", 3.0)])
def test_latencies(text, us):
    assert parse_latency(text) == pytest.approx(us)


@pytest.mark.parametrize("text", ["5", "fast", "1 hour", "-1ms", "1e999ms"])
def test_bad_latencies(text):
    with pytest.raises(OptionError):
        parse_latency(text)


def test_network_spec():
    spec = NetworkSpec.parse("bandwidth=1Gbit/s, latency=50us, medium=links")
    assert (spec.bandwidth, spec.latency_us, spec.medium) == (125e6, 50.0, "links")
    assert NetworkSpec.parse("bandwidth=25GB/s") == NetworkSpec(25e9, None, None)
    for bad in ("latency=1ms", "bandwidth=1Gbit/s,speed=2", "bandwidth=1Gbit/s,medium=air", "bandwidth",
                "bandwidth=1Gbit/s,bandwidth=2Gbit/s"):
        with pytest.raises(OptionError):
            NetworkSpec.parse(bad)


def test_ring_volumes():
    # gloo's all-reduce is a ring: 2(N-1) steps, each rank sends 2(N-1)/N of the buffer
    assert volume(pb.ALL_REDUCE, 1000, 4) == (6, 1500.0)
    assert volume(pb.ALL_REDUCE, 1000, 2) == (2, 1000.0)
    assert volume(pb.ALL_GATHER, 1000, 4) == (3, 3000.0)
    assert volume(pb.REDUCE_SCATTER, 1000, 4) == (3, 750.0)
    assert volume(pb.BARRIER, 1000, 4) is None
    assert network_us(2, 2e6, 1e9, 10.0) == pytest.approx(2020.0)
    assert network_us(2, 2e6, math.inf, 10.0) == 20.0


def _gloo(node_id: int, dur: int, size: int, deps, start: int) -> Spec:
    return Spec(node_id, f"gloo:all_reduce{node_id}", pb.COMM_COLL_NODE, dur, tuple(deps), (), start,
                [make_attr("is_cpu_op", False), make_attr("tid", 2), make_attr("comm_type", pb.ALL_REDUCE),
                 make_attr("comm_size", size), make_attr("pg_name", "0")])


# Two ranks on one clock, each: A(100) -> all-reduce of 100 kB -> B(100) -> all-reduce of 300 kB
# -> C(100). The collectives' measured times are exactly a bus of 100 MB/s (both ranks' bytes
# over it: 2 x S for an all-reduce of 2 ranks) with 10 us per step (2 steps): 2,020 and 6,020 us.
def _job(tmp_path) -> list:
    specs = [cpu(1, 100, start=0), _gloo(2, 2020, 100_000, [1], 100), cpu(3, 100, [2], start=2120),
             _gloo(4, 6020, 300_000, [3], 2220), cpu(5, 100, [4], start=8240)]
    return [load_graph(write_et(tmp_path / f"rank{r}.et", specs), r) for r in (0, 1)]


def _end(result) -> float:
    return max(e for e in result.end if not math.isnan(e))


def test_the_fit_finds_the_network_the_collectives_were_timed_on(tmp_path):
    graphs = _job(tmp_path)
    release = measured_release(graphs)
    assert _end(replay(graphs, ASTRA_SIM, release=release)) == 8340
    result = replay(graphs, ASTRA_SIM, release=release, network=NetworkSpec.parse("bandwidth=100MB/s"))
    (fit,) = result.network.fitted
    assert (fit.backend, fit.medium, fit.latency_told_apart) == ("cpu", "bus", True)
    assert fit.bandwidth == pytest.approx(1e8) and fit.latency_us == pytest.approx(10.0)
    assert fit.mean_abs_error == pytest.approx(0.0, abs=1e-9)
    assert _end(result) == pytest.approx(8340)  # the measured link: nothing moves
    assert result.network.retimed == 4


def test_a_slower_link_moves_only_the_network_part(tmp_path):
    graphs = _job(tmp_path)
    release = measured_release(graphs)
    # 50 MB/s: 2 x 20 + 4,000 + 12,000 us of transfers, the CPU ops as measured
    result = replay(graphs, ASTRA_SIM, release=release, network=NetworkSpec.parse("bandwidth=400Mbit/s"))
    assert _end(result) == pytest.approx(300 + 4020 + 12020)
    json.dumps(result.network.to_json())
    changes = {c.bytes: c for c in result.network.changes}
    assert changes[300_000].count == 2 and changes[300_000].what_if_network_us == pytest.approx(2 * 12020)
    # a latency given replaces the fitted one
    result = replay(graphs, ASTRA_SIM, release=release, network=NetworkSpec.parse("bandwidth=50MB/s,latency=0"))
    assert _end(result) == pytest.approx(300 + 4000 + 12000)
    # on links each rank has the rate to itself: the same times are a 50 MB/s link per rank
    result = replay(graphs, ASTRA_SIM, release=release, network=NetworkSpec.parse("bandwidth=50MB/s,medium=links"))
    assert result.network.fitted[0].bandwidth == pytest.approx(5e7)
    assert _end(result) == pytest.approx(8340)
    # a faster link never makes a collective shorter than 0
    result = replay(graphs, ASTRA_SIM, release=release, network=NetworkSpec.parse("bandwidth=1TB/s,latency=0"))
    assert _end(result) == pytest.approx(300, abs=1)


def test_without_network_the_replay_is_the_measured_one(tmp_path):
    graphs = _job(tmp_path)
    result = replay(graphs, ASTRA_SIM, release=measured_release(graphs))
    assert result.network is None and _end(result) == 8340


def _nccl(node_id: int, dur: int, size: int, deps, start: int) -> Spec:
    return Spec(node_id, f"ncclKernel_AllReduce{node_id}", pb.COMM_COLL_NODE, dur, tuple(deps), (), start,
                [make_attr("is_cpu_op", False), make_attr("stream", 20), make_attr("device", 0),
                 make_attr("comm_type", pb.ALL_REDUCE), make_attr("comm_size", size), make_attr("pg_name", "0")])


def test_gpu_collectives_move_on_links(tmp_path):
    # Two ranks, two NCCL all-reduces of 1 MB and 3 MB timed as links of 1 GB/s with 5 us a step
    # (each rank sends S: 2 steps): 1,010 and 3,010 us. At 500 MB/s: 2,010 and 6,010.
    specs = [_nccl(1, 1010, 1_000_000, [], 0), _nccl(2, 3010, 3_000_000, [1], 1010)]
    graphs = [load_graph(write_et(tmp_path / f"gpu{r}.et", specs), r) for r in (0, 1)]
    result = replay(graphs, ASTRA_SIM, release=measured_release(graphs), network=NetworkSpec.parse("bandwidth=500MB/s"))
    (fit,) = result.network.fitted
    assert (fit.backend, fit.medium) == ("gpu", "links") and fit.bandwidth == pytest.approx(1e9)
    assert fit.latency_us == pytest.approx(5.0)
    assert _end(result) == pytest.approx(2010 + 6010)


def test_an_episode_gives_back_no_more_than_it_holds():
    # a faster link takes 7 us off an episode of two collectives holding 5 and 3 us: the first
    # goes to 0, the second gives the other 2; nothing goes below 0
    from array import array

    from linker.sim.network import Episode, _apply

    duration = array("d", [9.0, 3.0])  # the first one's 9 us hold a 4 us wait for its peers
    _apply(Episode("cpu", 0, "0", [0, 1], [5.0, 3.0]), -7.0, duration)
    assert list(duration) == [4.0, 1.0]
    _apply(Episode("cpu", 0, "0", [0, 1], [0.0, 1.0]), -5.0, duration)
    assert list(duration) == [4.0, 0.0]
    _apply(Episode("cpu", 0, "0", [0, 1], [0.0, 0.0]), 6.0, duration)
    assert list(duration) == [10.0, 0.0]


# ---------------------------------------------------------------------------------------------
# The real what-if: tests/fixtures/whatif/<rate>/ and whatif_quiet/<rate>/ (docs/whatif.md,
# tests/fixtures/README.md)
# ---------------------------------------------------------------------------------------------

QUIET = Path(__file__).parent / "fixtures" / "whatif_quiet"
WHATIF_BOUND = 0.10  # issue 43's bound for one pair (the cross-pair spread is in docs/whatif.md)


def measured_job_span_us(job: Path) -> float:
    """The job span of a capture, from its Kineto files alone (not et-link's code): the latest end
    minus the earliest start of the CPU ops of the profiled steps over every rank (``ProfilerStep#N``
    bounds the ops et-link links)."""
    first, last = math.inf, -math.inf
    for path in sorted(job.glob("device.*.json.gz")):
        events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
        for event in events:
            if event.get("ph") == "X" and event.get("cat") in ("cpu_op", "user_annotation"):
                first = min(first, event["ts"])
                last = max(last, event["ts"] + event["dur"])
    return last - first


def _linked_pair(root: Path, out: Path) -> dict[str, Path]:
    """Both captures of ``root`` linked as ``et-link batch --format et`` links them, each with a
    what-if answered in its summary.json: the unlimited job asked about 1 Gbit/s, the slowed one
    about the unlimited trace's fitted network (the unlimited loopback as that trace shows it)."""
    from linker import link_job

    linked = {}
    network = "bandwidth=1Gbit/s"
    for rate in ("unlimited", "1gbit"):
        job = root / rate
        linked[rate] = out / rate
        summary = link_job(str(job / "device.*.json.gz"), linked[rate], str(job / "host.*.json.gz"), fmt="et",
                           workers=1, network=network)
        network = f"bandwidth={summary.simulator['network']['fitted'][0]['bandwidth_bytes_per_s']}B/s"
    return linked


@pytest.fixture(scope="module")
def whatif_jobs(tmp_path_factory) -> dict[str, Path]:
    """The pair captured on a shared host (``whatif``), linked (``_linked_pair``)."""
    return _linked_pair(FIXTURES, tmp_path_factory.mktemp("whatif"))


@pytest.fixture(scope="module")
def quiet_jobs(tmp_path_factory) -> dict[str, Path]:
    """The pair captured on a quiet host (``whatif_quiet``), linked (``_linked_pair``)."""
    return _linked_pair(QUIET, tmp_path_factory.mktemp("whatif_quiet"))


def raw_bus_fit(linked: Path) -> dict:
    """The bus network of a linked job's gloo all-reduces computed from the ``.et`` files' raw
    fields alone (not et-link's replay or fit), as docs/whatif.md defines it: per collective its
    ``comm_size``, ``comm_seq`` (issue order), measured start, measured duration
    (``inclusive_dur_micros``) and the time the replay holds it for (``duration_micros``). A
    collective every rank holds that started, on no rank, before the earlier ones there had
    ended is matched: its time is the longest over the ranks of their parts (a part: the duration
    less the wait for the last rank's start); the others are a rank's own, for their duration, and
    join the rank's episode. Each episode (a
    matched collective and the ones joining it) is a row: steps 2(N-1) and bus bytes 2(N-1)S per
    all-reduce. Least squares of time = steps * latency + bytes / bandwidth; latency 0 (the whole
    time over the bytes) where the rows cannot tell it apart or the fit gives it < 0."""
    from linker.write.chakra_wire import iter_frames

    ranks = []
    for path in sorted(linked.glob("rank.*.et")):
        held = {}
        for frame in iter_frames(path):
            node = pb.Node.FromString(frame.payload) if frame.index else None
            if node is None or node.type != pb.COMM_COLL_NODE:
                continue
            attrs = {a.name: getattr(a, a.WhichOneof("value")) for a in node.attr if a.WhichOneof("value")}
            held[attrs["comm_seq"]] = (node.start_time_micros, attrs["inclusive_dur_micros"], node.duration_micros,
                                       attrs["comm_size"])
        ranks.append(held)
    n = len(ranks)
    under = set()
    for held in ranks:
        latest_end = -math.inf
        for seq in sorted(held):
            start, measured, _, _ = held[seq]
            if start < latest_end:
                under.add(seq)
            latest_end = max(latest_end, start + measured)
    matched = {seq for seq in set.intersection(*(set(held) for held in ranks)) if seq not in under}
    rows, collectives = [], 0
    for held in ranks:
        episode = None
        for seq in sorted(held):
            start, _, duration, size = held[seq]
            if seq in matched:
                last = max(other[seq][0] for other in ranks)
                part = max(max(0, other[seq][2] - (last - other[seq][0])) for other in ranks)
                episode = [0, 0.0, 0.0]
                rows.append(episode)
            else:
                part = duration
                if episode is None:
                    episode = [0, 0.0, 0.0]
                    rows.append(episode)
            episode[0] += 2 * (n - 1)
            episode[1] += 2 * (n - 1) * size
            episode[2] += part
            collectives += 1
    saa = sum(a * a for a, _, _ in rows)
    sab = sum(a * b for a, b, _ in rows)
    sbb = sum(b * b for _, b, _ in rows)
    sat = sum(a * t for a, _, t in rows)
    sbt = sum(b * t for _, b, t in rows)
    det = saa * sbb - sab * sab
    latency, per_byte = -1.0, 0.0  # one steps-to-bytes ratio (det 0): latency not told apart
    if det > 1e-9 * saa * sbb:
        latency, per_byte = (sat * sbb - sbt * sab) / det, (saa * sbt - sab * sat) / det
    if latency < 0 or per_byte <= 0:
        latency, per_byte = 0.0, sum(t for _, _, t in rows) / sum(b for _, b, _ in rows)
    return {"bandwidth": 1e6 / per_byte, "latency_us": latency, "episodes": len(rows), "collectives": collectives,
            "bus_bytes": sum(b for _, b, _ in rows), "measured_us": sum(t for _, _, t in rows)}


def test_the_fixture_job_spans_are_what_simulate_measures(whatif_jobs):
    from linker import simulate

    for rate, linked in whatif_jobs.items():
        report = simulate(linked).report
        assert report.measured_us == pytest.approx(measured_job_span_us(FIXTURES / rate), rel=1e-3)
        assert report.ratio == pytest.approx(1.0, abs=0.01)


def test_a_slowed_loopback_predicted_from_the_unlimited_trace(quiet_jobs):
    from linker import simulate

    measured_slow = measured_job_span_us(QUIET / "1gbit")
    measured_fast = measured_job_span_us(QUIET / "unlimited")
    # the limit matters to this job: "no change" would be more than twice the bound off
    assert measured_slow > (1 + 2 * WHATIF_BOUND) * measured_fast
    predicted = simulate(quiet_jobs["unlimited"], network="bandwidth=1Gbit/s").report
    assert predicted.simulated_us == pytest.approx(measured_slow, rel=WHATIF_BOUND)
    assert predicted.network.fitted[0].medium == "bus" and predicted.network.kept == 0
    (slow_fit,) = _summary_network(quiet_jobs["1gbit"])["fitted"]  # what simulate --network fits (below)
    # the bus the slowed trace shows is the rate tbf was given (per-rank links would read half of it)
    assert slow_fit["bandwidth_bytes_per_s"] == pytest.approx(125e6, rel=0.10)


def test_the_unlimited_loopback_predicted_from_the_slowed_trace(quiet_jobs):
    from linker import simulate

    (fast_fit,) = _summary_network(quiet_jobs["unlimited"])["fitted"]
    predicted = simulate(quiet_jobs["1gbit"], network=f"bandwidth={fast_fit['bandwidth_bytes_per_s']}B/s").report
    assert predicted.simulated_us == pytest.approx(measured_job_span_us(QUIET / "unlimited"), rel=WHATIF_BOUND)


def _summary_network(linked: Path) -> dict:
    return json.loads((linked / "summary.json").read_text())["simulator"]["network"]


@pytest.mark.parametrize("rate", ["unlimited", "1gbit"])
def test_summary_holds_the_fitted_network_of_the_raw_collectives(whatif_jobs, rate):
    raw = raw_bus_fit(whatif_jobs[rate])
    (fit,) = _summary_network(whatif_jobs[rate])["fitted"]
    assert (fit["backend"], fit["medium"]) == ("cpu", "bus")
    assert (fit["episodes"], fit["collectives"]) == (raw["episodes"], raw["collectives"]) == (10, 20 - (rate == "unlimited"))
    assert fit["bandwidth_bytes_per_s"] == pytest.approx(raw["bandwidth"], rel=1e-6)
    assert fit["latency_us"] == pytest.approx(raw["latency_us"], abs=1e-3)
    assert fit["measured_us"] == pytest.approx(raw["measured_us"], rel=1e-6)


def test_summary_answers_the_what_if_of_batch_network(quiet_jobs):
    fast, slow = _summary_network(quiet_jobs["unlimited"]), _summary_network(quiet_jobs["1gbit"])
    raw_fast, raw_slow = raw_bus_fit(quiet_jobs["unlimited"]), raw_bus_fit(quiet_jobs["1gbit"])
    forward, back = fast["what_if"], slow["what_if"]
    assert forward["given"] == "bandwidth=1Gbit/s" and forward["network"]["fitted"] == fast["fitted"]
    assert back["network"]["fitted"] == slow["fitted"]
    # every collective's network part moves from the fitted bus to the given one: the bus bytes
    # over the difference of the rates
    assert forward["network"]["change_us"] == pytest.approx(
        raw_fast["bus_bytes"] * (1 / 125e6 - 1 / raw_fast["bandwidth"]) * 1e6, rel=1e-5)
    assert back["network"]["change_us"] == pytest.approx(
        raw_slow["bus_bytes"] * (1 / raw_fast["bandwidth"] - 1 / raw_slow["bandwidth"]) * 1e6, rel=1e-5)
    for answer, job in ((forward, "unlimited"), (back, "1gbit")):
        assert answer["measured_us"] == pytest.approx(measured_job_span_us(QUIET / job), rel=1e-3)
        assert answer["predicted_over_measured"] == pytest.approx(answer["predicted_us"] / answer["measured_us"],
                                                                  abs=1e-4)
    # and each prediction is the other run, within the bound
    assert forward["predicted_us"] == pytest.approx(measured_job_span_us(QUIET / "1gbit"), rel=WHATIF_BOUND)
    assert back["predicted_us"] == pytest.approx(measured_job_span_us(QUIET / "unlimited"), rel=WHATIF_BOUND)


def test_batch_without_network_writes_the_fit_and_no_what_if(tmp_path):
    from linker.batch.job_network import fitted_networks

    graphs = _job(tmp_path)  # the hand-written bus of 100 MB/s, 10 us a step
    (fit,) = fitted_networks(graphs, None)
    assert fit.bandwidth == pytest.approx(1e8) and fit.latency_us == pytest.approx(10.0)
    assert fitted_networks(graphs[:1], None) == []


def test_a_bad_batch_network_is_refused_before_any_work(tmp_path):
    from linker.batch import BatchConfig, run_batch

    config = BatchConfig(str(FIXTURES / "1gbit" / "host.*.json.gz"), str(FIXTURES / "1gbit" / "device.*.json.gz"),
                         tmp_path / "out", fmt="et", network="bandwidth=1Gbps")
    with pytest.raises(OptionError, match="ambiguous"):
        run_batch(config)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# ASTRA-sim workload copies whose CPU collectives the network carries (--astra-cpu-collectives network)
# ---------------------------------------------------------------------------------------------


def _copy_nodes(path: Path) -> dict[int, pb.Node]:
    from linker.write.chakra_wire import iter_frames

    return {node.id: node for node in (pb.Node.FromString(f.payload) for f in iter_frames(path) if f.index)}


def _attr(node: pb.Node, name: str, *default):
    """The value of ``node``'s attribute ``name``; ``default`` when given and the node has none."""
    return next((getattr(a, a.WhichOneof("value")) for a in node.attr if a.name == name), *default)


def _astra_ring_us(size: int, npus: int, gbps: float, latency_ns: float = 0.0) -> float:
    """ASTRA-sim's congestion-unaware time of a ring all-reduce alone on a FullyConnected network
    of links of ``gbps`` GB/s (2^30 bytes), ``latency_ns`` a link, et-link's system file (endpoint
    delay 10 ns, local memory 1,600 GB/s): 10 + 2(N-1)(10 + floor(L + m / B)) + (N-1) 3 floor(m /
    1600 GB/s), m = S / N (ASTRA-sim's Ring.cc and BasicTopology, as docs/astra-sim.md derives)."""
    message = size // npus
    per_step = math.floor(latency_ns + message / (gbps * 2 ** 30 / 1e9))
    return (10 + 2 * (npus - 1) * (10 + per_step) + (npus - 1) * 3 * math.floor(message / 1600)) / 1000


def test_astra_copies_carry_the_gloo_collectives_on_the_fitted_bus(whatif_jobs, tmp_path):
    """The ``network`` form: network.yml is the bus the trace's collectives fit, as links of rate / N;
    each matched all-reduce is the 1-byte meeting, then an all-reduce of its episode's bytes (the
    ones every rank's episode carried), then the rank's time less the network's, as a COMP_NODE
    (taken from the next of the episode's nodes where it would go below 0); where a collective
    then ends after its replayed end, the CPU ops that waited for it give that time back.
    Expected values from the .et files' raw fields and the measured form's copies."""
    from linker.batch.astra_setup import setup_for_files

    linked = whatif_jobs["unlimited"]
    setup_for_files([linked], tmp_path / "measured", {})
    setup_for_files([linked], tmp_path / "network", {"cpu_collectives": "network"})
    raw = raw_bus_fit(linked)
    gbps = float(f"{raw['bandwidth'] / 2 / 2 ** 30:.4g}")
    yml = (tmp_path / "network" / "network.yml").read_text()
    assert f"bandwidth: [ {gbps} ]" in yml and "latency: [ 0.0 ]" in yml and "FullyConnected" in yml
    assert "bandwidth: [ 50.0 ]" in (tmp_path / "measured" / "network.yml").read_text()  # the default, as before
    episodes = []  # per rank: the episodes' gloo node ids, in issue order (a matched one opens one)
    for rank in (0, 1):
        nodes = _copy_nodes(tmp_path / "measured" / f"workload.{rank}.et")
        timed = sorted((n for n in nodes.values() if n.name == "gloo:all_reduce" and n.type == pb.COMP_NODE),
                       key=lambda n: n.id)
        mine = []
        for node in timed:
            if any(nodes[d].type == pb.COMM_COLL_NODE for d in node.data_deps) or not mine:
                mine.append([])
            mine[-1].append(node.id)
        episodes.append((nodes, mine))
    assert [len(mine) for _, mine in episodes] == [5, 5]
    sizes = [{node.id: _attr(node, "comm_size") for node in _copy_nodes(linked / f"rank.{rank}.et").values()
              if node.type == pb.COMM_COLL_NODE} for rank in (0, 1)]
    # the last step's second bucket was lost by rank 1's ET: that episode carries the first's bytes
    assert [sum(sizes[r][i] for i in episodes[r][1][-1]) for r in (0, 1)] == [789_504 + 263_168, 789_504]
    for rank, (measured, mine) in enumerate(episodes):
        nodes = _copy_nodes(tmp_path / "network" / f"workload.{rank}.et")
        late = {}  # a collective -> the µs the carried collective makes it end after its replayed end
        for k, ids in enumerate(mine):
            carried_bytes = min(sum(sizes[r][i] for i in episodes[r][1][k]) for r in (0, 1))
            head = nodes[ids[0]]
            (carried,) = [nodes[d] for d in head.data_deps]
            (meeting,) = [nodes[d] for d in carried.data_deps]
            assert carried.type == meeting.type == pb.COMM_COLL_NODE and _attr(meeting, "comm_size") == 1
            assert _attr(carried, "comm_size") == carried_bytes and _attr(carried, "comm_type") == pb.ALL_REDUCE
            left = _astra_ring_us(carried_bytes, 2, gbps)
            for i in ids:
                was = measured[i].duration_micros
                taken = min(was, left)
                left -= taken
                assert nodes[i].duration_micros == pytest.approx(was - taken, abs=1)
                if left >= 1:
                    late[i] = left
        # that lateness is taken back from the CPU ops that waited for those collectives, on their
        # thread and after them, each op to 0 at most, never more than the collectives were late
        original = _copy_nodes(linked / f"rank.{rank}.et")
        shortened = {i: original[i].duration_micros - node.duration_micros for i, node in nodes.items()
                     if i in original and original[i].type == pb.COMP_NODE and
                     node.duration_micros != original[i].duration_micros}
        assert all(0 < cut <= original[i].duration_micros for i, cut in shortened.items())
        assert all(nodes[i].type == pb.COMP_NODE and _attr(nodes[i], "is_cpu_op") for i in shortened)
        assert min(original[i].start_time_micros for i in shortened) > min(original[i].start_time_micros for i in late)
        waited = {node.id for node in original.values() if set(node.data_deps) & set(late)}
        assert waited & set(shortened)
        assert 1_000 < sum(shortened.values()) <= sum(late.values()) + len(late) + len(shortened)


def test_a_late_collective_is_taken_back_from_the_ops_that_waited_for_it(tmp_path):
    """``_repay``: a collective 250 us late: the op that waited for it (A, 100 us) gives its whole
    time, the thread's wait of 100 us before B absorbs 100 of the 150 still owed, B gives the other
    50, C nothing; an op that did not wait for it (D, another thread) nothing. A second collective
    late by less than what the thread still owes adds nothing (the later of the two, not the sum)."""
    from linker.batch.astra_collectives import _repay

    specs = [_gloo(1, 1000, 100_000, [], 100), cpu(2, 100, [1], start=1100), cpu(3, 100, [2], start=1300),
             cpu(4, 500, [3], start=1400), cpu(5, 300, [], tid=7, start=1100)]
    graph = load_graph(write_et(tmp_path / "rank0.et", specs), 0)
    issue = [graph.start[u] for u in range(len(graph))]
    end = [graph.start[u] + graph.duration[u] for u in range(len(graph))]
    at = {graph.ids[u]: u for u in range(len(graph))}
    edits = {}
    assert _repay(graph, edits, [(at[1], 250.0)], issue, end) == pytest.approx(150.0)
    assert {i: e.timed_us for i, e in edits.items()} == {2: 0, 3: 50} and all(e.kept for e in edits.values())
    # B also waited for a collective that ended at 1300, 30 us late: B still owes 50, so 50
    specs[2] = cpu(3, 100, [2, 6], start=1300)
    specs.append(_gloo(6, 200, 100_000, [], 1100))
    graph = load_graph(write_et(tmp_path / "rank0.et", specs), 0)
    issue = [graph.start[u] for u in range(len(graph))]
    end = [graph.start[u] + graph.duration[u] for u in range(len(graph))]
    at = {graph.ids[u]: u for u in range(len(graph))}
    edits = {}
    assert _repay(graph, edits, [(at[1], 250.0), (at[6], 30.0)], issue, end) == pytest.approx(150.0)
    assert {i: e.timed_us for i, e in edits.items()} == {2: 0, 3: 50}
    # and 80 late instead: more than the 50 still owed, so B gives 80
    edits = {}
    assert _repay(graph, edits, [(at[1], 250.0), (at[6], 80.0)], issue, end) == pytest.approx(180.0)
    assert {i: e.timed_us for i, e in edits.items()} == {2: 0, 3: 20}


def test_astra_copies_retime_what_the_carried_collectives_do_not_hold(tmp_path):
    """A collective only one rank's ET kept has no meeting and no collective ASTRA-sim could time,
    and a rank's episode may hold more than the bytes every member's held: in the ``network`` form
    that time moves by ASTRA-sim's time for those bytes on the network written less on the fitted
    one, as simulate --network moves it; on the fitted network it keeps its replayed time."""
    from dataclasses import replace

    from linker.batch.astra_collectives import cpu_collective_edits, retime_uncarried

    def numbered(spec, seq):
        spec.attrs.append(make_attr("comm_seq", seq))
        return spec

    # rank 1's first all-reduce, which rank 0's ET lost, then one both hold: the first runs alone
    both = [cpu(1, 100, start=0), numbered(_gloo(2, 2020, 100_000, [1], 100), 1), cpu(3, 100, [2], start=2120)]
    mine = [cpu(5, 100, start=0), numbered(_gloo(4, 6020, 300_000, [5], 100), 0), cpu(1, 100, [4], start=6120),
            numbered(_gloo(2, 2020, 100_000, [1], 6220), 1), cpu(3, 100, [2], start=8240)]
    graphs = [load_graph(write_et(tmp_path / "rank0.et", both), 0), load_graph(write_et(tmp_path / "rank1.et", mine), 1)]
    carried = cpu_collective_edits(graphs, None, "network")
    assert [(e.rank, e.node_ids) for e in carried.uncarried] == [(1, [4])]
    replayed = carried.edits[1][4].timed_us
    assert replayed == 6020 and carried.edits[1][4].carried is None
    retime_uncarried(carried, carried.network)
    assert carried.edits[1][4].timed_us == replayed
    fitted = carried.network
    slower = replace(fitted, bandwidth_gbps=fitted.bandwidth_gbps / 4)
    retime_uncarried(carried, slower)
    change = (_astra_ring_us(300_000, 2, slower.bandwidth_gbps, fitted.latency_ns)
              - _astra_ring_us(300_000, 2, fitted.bandwidth_gbps, fitted.latency_ns))
    assert change > 1_000 and carried.edits[1][4].timed_us == pytest.approx(replayed + change, abs=1)
    # a matched episode holding more than every member's (rank 1 ran its second all-reduce under
    # the first; rank 0's ET lost it): the carried collective holds the bytes both held, rank 1's
    # rest moves as the one run alone did
    both = [cpu(1, 100, start=0), numbered(_gloo(2, 2020, 100_000, [1], 100), 0), cpu(3, 100, [2], start=2120)]
    beside = both + [numbered(_gloo(4, 6020, 300_000, [1], 1000), 1)]
    graphs = [load_graph(write_et(tmp_path / "rank0.et", both), 0), load_graph(write_et(tmp_path / "rank1.et", beside), 1)]
    carried = cpu_collective_edits(graphs, None, "network")
    assert [(e.rank, e.node_ids, e.carried) for e in carried.uncarried] == [(1, [2, 4], (pb.ALL_REDUCE, 100_000))]
    before = [dict((i, e.timed_us) for i, e in edits.items()) for edits in carried.edits]
    fitted = carried.network
    slower = replace(fitted, bandwidth_gbps=fitted.bandwidth_gbps / 4)
    retime_uncarried(carried, slower)
    change = (_astra_ring_us(300_000, 2, slower.bandwidth_gbps, fitted.latency_ns)
              - _astra_ring_us(300_000, 2, fitted.bandwidth_gbps, fitted.latency_ns))
    after = [dict((i, e.timed_us) for i, e in edits.items()) for edits in carried.edits]
    assert after[0] == before[0]
    assert sum(after[1].values()) - sum(before[1].values()) == pytest.approx(change, abs=2)


def test_the_network_form_needs_a_job_of_cpu_collectives_only(tmp_path):
    from linker.batch.astra_collectives import check_form, cpu_collective_edits

    graphs = _job(tmp_path)  # the hand-written bus of 100 MB/s, 10 us a step
    carried = cpu_collective_edits(graphs, None, "network")
    assert carried.carried == 4 and carried.network.bandwidth_gbps == float(f"{1e8 / 2 / 2 ** 30:.4g}")
    assert carried.network.latency_ns == pytest.approx(10_000) and carried.bus.latency_told_apart
    # each collective's measured time is its network time: nothing is left for the timed part
    assert all(edit.timed_us <= 1 and edit.carried[2] in (100_000, 300_000) for edits in carried.edits
               for edit in edits.values() if not edit.kept)
    # ASTRA-sim's 1-byte meeting before each carried collective takes its 2 ring steps of latency too:
    # 10 + 2 (10 + 10,000) ns, taken from the CPU op after each collective (100 us measured)
    meeting_us = (10 + 2 * (10 + 10_000)) / 1000
    assert [{i: edit.timed_us for i, edit in edits.items() if edit.kept} for edits in carried.edits] == \
        [{3: round(100 - meeting_us), 5: round(100 - meeting_us)}] * 2
    # (and the carried collective's own time, within the written bandwidth's 4 digits of the part's)
    assert carried.repaid == pytest.approx(4 * meeting_us, abs=0.5)
    assert cpu_collective_edits(graphs, None).network is None  # the measured form by default
    single = cpu_collective_edits(graphs[:1], None, "network")
    assert single.edits == [{}] and "single rank" in single.notes[0]
    specs = [cpu(1, 100, start=0), _gloo(2, 2020, 100_000, [1], 100), _nccl(3, 1010, 1_000_000, [2], 2120)]
    mixed = [load_graph(write_et(tmp_path / f"mixed{r}.et", specs), r) for r in (0, 1)]
    cpu_only = cpu_collective_edits(mixed, None, "network")
    assert cpu_only.network is None and cpu_only.carried == 0 and "GPU collectives" in cpu_only.notes[0]
    assert all(edit.carried is None and edit.sync_id is not None for edits in cpu_only.edits for edit in edits.values())
    with pytest.raises(OptionError, match="astra-cpu-collectives"):
        check_form("links")


def test_astra_setup_cli_writes_the_network_form_and_refuses_a_bad_one(whatif_jobs, tmp_path):
    from typer.testing import CliRunner

    from linker.cli import app

    linked = whatif_jobs["1gbit"]
    bad = CliRunner().invoke(app, ["astra-setup", str(linked), "--astra-cpu-collectives", "links",
                                   "--output-dir", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "unknown --astra-cpu-collectives 'links'" in bad.output
    assert len(bad.output.strip().splitlines()) == 1 and not (tmp_path / "bad").exists()
    good = CliRunner().invoke(app, ["astra-setup", str(linked), "--astra-cpu-collectives", "network",
                                    "--astra-bandwidth", "0.05821", "--output-dir", str(tmp_path / "at_1gbit")])
    assert good.exit_code == 0, good.output
    assert "standing for the CPU collectives' bus" in (tmp_path / "at_1gbit" / "network.yml").read_text()
    assert "bandwidth: [ 0.05821 ]" in (tmp_path / "at_1gbit" / "network.yml").read_text()
    assert "stands for the CPU collectives' bus as simulate --network fits it: 870.9 Mbit/s" in good.output


def test_a_collective_run_beside_the_earlier_one_moves_with_the_medium(tmp_path):
    """``ddp_gloo_swapped`` (4 ranks; tests/fixtures/README.md): the last step's second all-reduce
    ran wholly under its first on every rank (gloo's two workers), so the replay holds it, after its
    worker took it, for the time it communicated beside the first. Under ``lanes`` (its worker
    thread its own unit), halving the communication shortens the time from when it became ready to
    its end by half its record's duration, read from the Kineto file. Before, that time was kept
    as the host's (a worker's pickup): a network what-if left it as measured, and predicting the
    unlimited loopback from a 500 Mbit/s capture of this job read +39% (now −15%, −12% in the real
    ASTRA-sim)."""
    from conftest import FIXTURES as ALL, linked_rank
    from linker.sim.engine import LANES, Scale

    job = ALL / "ddp_gloo_swapped"
    paths = [linked_rank(tmp_path, job, rank) for rank in range(4)]
    graphs = [load_graph(path) for path in paths]
    as_measured, half = replay(graphs, LANES, Scale()), replay(graphs, LANES, Scale.parse("comm=0.5"))
    checked, offset = 0, 0
    for rank, (graph, path) in enumerate(zip(graphs, paths)):
        events = json.loads(gzip.decompress((job / f"device.{rank}.json.gz").read_bytes()))["traceEvents"]
        records = sorted((e for e in events if e.get("name") == "gloo:all_reduce"),
                         key=lambda e: e["args"]["Record function id"])
        node_of_rf = {next(a["value"] for a in n["attrs"] if a["name"] == "rf_id"): n["id"]
                      for n in json.loads(path.read_text())["nodes"] if n["name"] == "gloo:all_reduce"}
        place = {node_id: u for u, node_id in enumerate(graph.ids)}
        for k, record in enumerate(records):
            under = any(e["ts"] <= record["ts"] and record["ts"] + record["dur"] <= e["ts"] + e["dur"]
                        for e in records[:k])
            node = node_of_rf.get(record["args"]["Record function id"])
            if not under or node is None:
                continue
            v = offset + place[node]
            shortened = (as_measured.end[v] - as_measured.ready[v]) - (half.end[v] - half.ready[v])
            assert shortened == pytest.approx(record["dur"] / 2, abs=1.0), (rank, node)
            checked += 1
        offset += len(graph)
    assert checked == 4


def test_episodes_follow_the_issue_order(tmp_path):
    """``ddp_gloo_swapped``: on rank 2 the ET ids of a step's two all-reduces run against their
    issue. The network fit's episodes still take each rank's collectives in issue order: read
    episode by episode, a rank's issue numbers ascend (a gap where its ET lost one). Before, rank 2
    put the step's second all-reduce, issue 7, in the episode of issues 4 and 5, and began the
    next one with issue 6."""
    from conftest import FIXTURES as ALL, linked_rank
    from linker.sim.engine import match_communication, node_offsets
    from linker.sim.network import fit_job

    graphs = [load_graph(linked_rank(tmp_path, ALL / "ddp_gloo_swapped", rank, ".et"), rank) for rank in range(4)]
    offsets = node_offsets(graphs)
    groups = match_communication(graphs, offsets, None)
    duration = [d for graph in graphs for d in graph.duration]
    episodes = [e for mine in fit_job(graphs, offsets, groups, duration).episodes.values() for e in mine]
    assert sum(len(e.nodes) for e in episodes) == 39
    for r, graph in enumerate(graphs):
        numbers = [graph.comm[v - offsets[r]].seq for e in episodes if e.rank == graph.rank for v in e.nodes]
        assert numbers == sorted(numbers) and len(numbers) >= 9, (r, numbers)


def _beside_a_late_peer(tmp_path) -> list:
    """Two ranks on one clock, each: A (100-110) forks collective Y (worker 3), B then issues
    collective X (worker 2; issue numbers X 0, Y 1). B lasts 2 µs on rank 0 and 10 on rank 1, so
    X's last member arrives at 120 and both X records end at 142: X's part after the last arrival
    is 22 µs. Y ran wholly beside X (record 110-138, no busy part of its own), from before X's
    last arrival: its 28 µs beside X are longer than X's part. Both collectives all-reduce 1,024
    bytes."""
    from linker.sim.load import load_graph
    from sim_graphs import cpu_coll

    graphs = []
    for rank, b_dur in ((0, 2), (1, 10)):
        x, y = cpu_coll(2, 142 - 110 - b_dur, [4], start=110 + b_dur, tid=2), cpu_coll(3, 0, [1], start=110, tid=3)
        x.attrs.append(make_attr("comm_seq", 0))
        y.attrs += [make_attr("comm_seq", 1), make_attr("inclusive_dur_micros", 28)]
        specs = [cpu(1, 10, start=100), cpu(4, b_dur, [1], start=110), x, y]
        graphs.append(load_graph(write_et(tmp_path / f"rank{rank}.et", specs), rank))
    return graphs


@pytest.mark.parametrize("model", ["astra-sim", "lanes"])
def test_a_collective_beside_the_earlier_one_ends_with_it_on_a_slower_network(tmp_path, model):
    """``_beside_a_late_peer`` on a bus a quarter as fast as the one the job fits: the ranks' four
    all-reduces of 1,024 bytes put 2 x (2 x 1,024) bytes on the bus after X's last arrival (120),
    measured in X's 22 µs, so 88 µs now: the job ends at 208, a 108 µs span from 100. Y's time
    beside X ends with X's new time. Before, it grew by X's episode factor (4) as a whole, its 6 µs
    before X's last arrival with it (28 x 4 = 112 µs from 110): the job ended at 222 (122 µs)."""
    graphs = _beside_a_late_peer(tmp_path)
    measured = replay(graphs, model, release=measured_release(graphs))
    assert max(e for e in measured.end if not math.isnan(e)) == pytest.approx(42.0)  # from 100, the job's start
    bus = 2 * 2 * 1024 / 22e-6  # bytes/s: the bus the job shows
    result = replay(graphs, model, release=measured_release(graphs), network=NetworkSpec.parse(f"bandwidth={bus / 4}B/s"))
    (fit,) = result.network.fitted
    assert fit.bandwidth == pytest.approx(bus)
    assert max(e for e in result.end if not math.isnan(e)) == pytest.approx(108.0)
