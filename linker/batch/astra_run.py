"""``et-link astra-run DIR``: run the ASTRA-sim setup that ``batch --format et`` or ``astra-setup``
wrote (``astra_setup``), read what ASTRA-sim prints and set it beside the measured times.

- The setup: ``DIR/run`` or ``DIR/astra/run``. Its ``run`` script is run as it is, with
  ``ASTRA_SIM_BIN`` set to the binary (``--bin``, else the environment's ``ASTRA_SIM_BIN``; a bare
  name is looked up on ``PATH``); its whole output is kept in ``astra-run.log`` beside it.
- ASTRA-sim's answer: one ``sys[i] finished, T cycles, exposed communication E cycles.`` line per
  NPU (``FINISHED``); cycles are ns. NPU i's end counts from the job's start, so its step is T less
  the start offset written into its trace (the leading delay node of ``--rank-start measured``);
  the job ends at the largest T. The "exposed communication" is T less ASTRA-sim's GPU busy time:
  et-link's host ops are CPU nodes, so it counts them too and is not communication; it is kept in
  ``--json`` only. The statistics pass's ``[critical] warning!`` lines and the like are counted,
  not printed (``noise_summary``; docs/astra-sim.md says why they are harmless).
- The measured side: a batch's ``summary.json`` beside the setup (each rank's measured span, the
  rank start offsets; the job span is the latest end less the earliest start), else the workload
  files themselves (``sim.load``: their timed nodes' span and their delay node). A single pair's
  setup runs one file as 2 NPUs: one row. NPU i is rank i, or the rank ``npu_ranks.json`` gives it
  (a setup of ranks that are not 0..n-1: ``astra_setup.npu_numbers``); rows name the rank.

``scripts/astra_check.py`` runs the real binary through ``run_setup`` and ``compare`` too. Cost: the
simulator's run, then O(ranks) (O(nodes) per rank without ``summary.json``).
"""

from __future__ import annotations

import filecmp
import json
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from linker.batch.astra_setup import NPU_RANKS_FILE, SETUP_DIR, WORKLOAD_PREFIX
from linker.model.errors import EtLinkError, TraceInputError
from linker.sim.engine import ASTRA_SIM
from linker.sim.hints import SLOW_RATIO

BIN_ENV = "ASTRA_SIM_BIN"
LOG_NAME = "astra-run.log"
# ``Workload::report``: "sys[{}] finished, {} cycles, exposed communication {} cycles." (some
# builds: "sys[{}] iteration {} finished, ..."; the last one of an NPU is its end).
FINISHED = re.compile(r"sys\[(\d+)\](?: iteration \d+)? finished, (\d+) cycles"
                      r"(?:, exposed communication (\d+) cycles)?")
# ASTRA-sim's lines that are not its answer, counted under a plain-words reason (docs/astra-sim.md).
NOISE = (
    ("warning! a callable is removed before call", "statistics pass"),
    ("Only GPU and COMM types are supported for overlap extraction", "statistics pass"),
    ("Exiting", "normal end"),
)


class AstraRunError(TraceInputError):
    """ASTRA-sim itself failed, or printed no answer: ``<path>: <problem>``, one line."""


@dataclass
class AstraOutput:
    """What one run of the setup printed: each NPU's end (``finished_ns``) and "exposed
    communication" (``exposed_ns``), in ns; every line (``text``); where the log was kept."""

    finished_ns: dict[int, int]
    exposed_ns: dict[int, int]
    text: str
    log: Path | None = None

    def noise_summary(self) -> list[str]:
        """The lines not shown, condensed: counts per kind."""
        return noise_summary(self.text)


@dataclass
class RankRow:
    rank: int
    start_us: float  # the start offset in the rank's trace (0 with --rank-start zero)
    measured_us: float | None  # its measured step
    astra_end_us: float  # ASTRA-sim's "finished", from the job's start
    exposed_us: float | None = None
    npu: int | None = None  # ASTRA-sim's NPU id when it is not ``rank`` (``npu_ranks.json``)

    @property
    def astra_us(self) -> float:
        return self.astra_end_us - self.start_us

    @property
    def ratio(self) -> float | None:
        return self.astra_us / self.measured_us if self.measured_us else None


@dataclass
class Comparison:
    setup: Path
    ranks: list[RankRow]
    measured_job_us: float | None  # latest measured end less earliest measured start
    astra_job_us: float  # the largest "finished"
    measured_from: str  # "summary.json" or "the workload files"
    single: bool = False  # one file run as 2 NPUs
    rank_start: str = "measured"
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        return self.astra_job_us / self.measured_job_us if self.measured_job_us else None


def find_setup(path: str | os.PathLike) -> Path:
    """The setup folder of ``path``: itself when it holds ``run``, else its ``astra/``."""
    path = Path(path)
    if not path.exists():
        raise TraceInputError(path, "no such directory")
    for folder in (path, path / SETUP_DIR):
        if (folder / "run").is_file():
            return folder
    raise TraceInputError(path, f"no ASTRA-sim setup here (no run script in it or in its {SETUP_DIR}/): write one "
                          "with et-link batch --format et or et-link astra-setup FILE.et")


def resolve_binary(given: str | None) -> Path:
    """The ASTRA-sim binary: ``given`` (``--bin``), else ``$ASTRA_SIM_BIN``; checked to be an
    executable file. Raises ``TraceInputError`` naming the path."""
    name = given if given else os.environ.get(BIN_ENV)
    if not name:
        raise TraceInputError(BIN_ENV, "no ASTRA-sim binary: give --bin PATH or set ASTRA_SIM_BIN to an ASTRA-sim "
                              "analytical binary, e.g. .../bin/AstraSim_Analytical_Congestion_Unaware (docs/astra-sim.md)")
    where = "--bin" if given else BIN_ENV
    if os.sep not in name and not Path(name).exists():
        found = shutil.which(name)
        if found is None:
            raise TraceInputError(name, f"the ASTRA-sim binary ({where}) is not on PATH")
        name = found
    binary = Path(name)
    if not binary.exists():
        raise TraceInputError(binary, f"the ASTRA-sim binary ({where}) does not exist")
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise TraceInputError(binary, f"the ASTRA-sim binary ({where}) is not an executable file")
    return binary.absolute()


def parse_output(text: str) -> tuple[dict[int, int], dict[int, int]]:
    """({npu: finished cycles}, {npu: exposed communication cycles}) of ASTRA-sim's output."""
    finished, exposed = {}, {}
    for match in FINISHED.finditer(text):
        npu = int(match.group(1))
        finished[npu] = int(match.group(2))
        if match.group(3) is not None:
            exposed[npu] = int(match.group(3))
    return finished, exposed


def noise_summary(text: str) -> list[str]:
    """ASTRA-sim's lines that are not its answer, counted: '8 "[critical] warning! a callable is
    removed before call" (statistics pass)'. Other warning or error lines are counted by text."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if FINISHED.search(line):
            continue
        for words, why in NOISE:
            if words in line:
                key = f'"{_level(line)}{words}" ({why})'
                break
        else:
            if not re.search(r"\[(warning|critical|error)\]|warning!", line):
                continue
            key = f'"{_message(line)[:110]}"'
        counts[key] = counts.get(key, 0) + 1
    return [f"{count} x {key}" for key, count in counts.items()]


def _level(line: str) -> str:
    level = re.search(r"\[(info|warning|critical|error)\]", line)
    return f"[{level.group(1)}] " if level else ""


def _message(line: str) -> str:
    """A log line without its spdlog prefix ("[time] [logger] [level] ")."""
    return re.sub(r"^(\[[^\]]*\]\s*)+", "", line).strip() or line.strip()


def _last_words(text: str) -> str:
    """The line that says why ASTRA-sim stopped: the last one naming an error, else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.search(r"assert|error|abort|fault|terminate|exception|invalid|fail|not found|cannot",
                     line, re.I):
            return _message(line)[:300]
    return _message(lines[-1])[:300] if lines else "no output"


def run_setup(setup: Path, binary: Path, extra_args: list[str] | tuple[str, ...] = (),
              keep_log: bool = True) -> AstraOutput:
    """Run ``setup/run`` with ``ASTRA_SIM_BIN=binary``; its output parsed. The whole output goes to
    ``setup/astra-run.log`` (``keep_log``). Raises ``AstraRunError`` (one line) when the run cannot
    start, exits non-zero, or prints no ``sys[i] finished`` line."""
    script = setup / "run"
    env = dict(os.environ, **{BIN_ENV: str(binary)})
    try:
        done = subprocess.run([str(script), *extra_args], capture_output=True, text=True, env=env,
                              errors="replace", stdin=subprocess.DEVNULL)
    except OSError as err:
        raise AstraRunError(script, f"cannot run the setup's script ({err.strerror or err})") from None
    text = done.stdout + ("\n" if done.stdout and done.stderr else "") + done.stderr
    log = None
    if keep_log:
        log = setup / LOG_NAME
        try:
            log.write_text(text)
        except OSError:
            log = None
    where = f" (whole output: {log})" if log else ""
    if done.returncode != 0:
        status = (f"was killed by signal {-done.returncode}" if done.returncode < 0
                  else f"exited with status {done.returncode}")
        raise AstraRunError(binary, f"ASTRA-sim {status}: {_last_words(text)}{where}")
    finished, exposed = parse_output(text)
    if not finished:
        raise AstraRunError(binary, f"ASTRA-sim printed no 'sys[i] finished, N cycles' line, so its output cannot "
                            f"be read: {_last_words(text)}{where}")
    return AstraOutput(finished, exposed, text, log)


def _workload_files(setup: Path) -> dict[int, Path]:
    out = {}
    for path in setup.glob(f"{WORKLOAD_PREFIX}.*.et"):
        middle = path.name[len(WORKLOAD_PREFIX) + 1:-3]
        if middle.isdigit():
            out[int(middle)] = path
    return out


def _npu_ranks(setup: Path) -> dict[int, int]:
    """{NPU: rank} from the setup's ``npu_ranks.json``; {} (NPU i is rank i) when there is none or
    it is not a list of distinct ranks."""
    try:
        ranks = json.loads((setup / NPU_RANKS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(ranks, list) or not all(isinstance(r, int) for r in ranks) or len(set(ranks)) != len(ranks):
        return {}
    return dict(enumerate(ranks))


def _single(files: dict[int, Path]) -> bool:
    """One file run as 2 NPUs (``astra_setup`` of a single pair): both workloads the same file."""
    if sorted(files) != [0, 1]:
        return False
    a, b = files[0], files[1]
    try:
        return a.resolve() == b.resolve() or filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


def _from_summary(path: Path) -> tuple[dict[int, tuple[float, float]], dict[int, float], str] | None:
    """{rank: measured (start, end)}, {rank: start offset in its trace}, the rank start rule, of a
    batch's summary.json; None when there is none or it holds no spans."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict):
        return None
    spans = {}
    for row in summary.get("ranks") or []:
        span = row.get("measured_span") if isinstance(row, dict) else None
        if isinstance(span, list) and len(span) == 2 and all(isinstance(v, (int, float)) for v in span):
            spans[int(row["rank"])] = (float(span[0]), float(span[1]))
    if not spans:
        return None
    start = (summary.get("simulator") or {}).get("rank_start") or {}
    rule = start.get("rule", "measured")
    offsets = {int(r): float(v) for r, v in (start.get("offsets_us") or {}).items()} if rule == "measured" else {}
    return spans, offsets, rule


def _from_files(files: dict[int, Path]) -> tuple[dict[int, tuple[float, float]], dict[int, float]]:
    """The measured span and the delay node's length of each workload file (``sim.load``)."""
    from linker.plan.rank_start import DELAY_NODE_NAME
    from linker.sim.load import load_graph

    spans, offsets = {}, {}
    for rank, path in sorted(files.items()):
        graph = load_graph(path, rank)
        first, last = graph.measured_span()
        if not math.isnan(first):  # the file has measured times
            spans[rank] = (first, last)
        offsets[rank] = next((graph.duration[u] for u, name in enumerate(graph.names) if name == DELAY_NODE_NAME), 0.0)
    return spans, offsets


def compare(setup: Path, output: AstraOutput) -> Comparison:
    """ASTRA-sim's ends beside the measured times (the module's docstring says from where)."""
    files = _workload_files(setup)
    single = _single(files)
    finished = output.finished_ns
    notes = []
    found = _from_summary(setup.parent / "summary.json") if not single else None
    rank_of = {} if single else _npu_ranks(setup)
    if found is not None:
        spans, offsets, rule = found
        if rank_of:  # keyed by NPU, as the files and ASTRA-sim's lines are
            spans = {npu: spans[rank] for npu, rank in rank_of.items() if rank in spans}
            offsets = {npu: offsets[rank] for npu, rank in rank_of.items() if rank in offsets}
        measured_from = "summary.json"
    else:
        spans, offsets = _from_files({0: files[0]} if single else files)
        rule = "measured" if any(offsets.values()) else "zero"
        measured_from = "the workload files"
    npus = [0] if single else sorted(finished)
    if single:
        notes.append("a single rank, run as 2 NPUs (both replay the same file): NPU 0's end")
    missing = sorted(set(files) - set(finished)) if files else []
    if missing:
        notes.append(f"ASTRA-sim printed no finish for NPU(s) {missing}")
    rows = []
    for npu in npus:
        span = spans.get(npu)
        rows.append(RankRow(rank_of.get(npu, npu), offsets.get(npu, 0.0), span[1] - span[0] if span else None,
                            finished[npu] / 1000.0,
                            output.exposed_ns[npu] / 1000.0 if npu in output.exposed_ns else None,
                            npu if npu in rank_of else None))
    measured_job = None
    if spans:
        used = [spans[n] for n in npus if n in spans]
        if used:
            measured_job = max(end for _, end in used) - min(start for start, _ in used)
    astra_job = max(finished[n] for n in npus) / 1000.0
    if rule == "zero" and len(rows) > 1:
        notes.append("the ranks start together in the traces (--rank-start zero): the job is set against the measured "
                     "job span all the same")
    return Comparison(setup, rows, measured_job, astra_job, measured_from, single, rule, notes)


def serialization_notes(setup: Path) -> list[str]:
    """Why ASTRA-sim may run the setup long, from ``et-link simulate``'s replay of the same workload
    files under its model (which issues as ASTRA-sim does): its notes that the critical path waited
    for the one CPU or GPU unit while another thread's or stream's op held it (``sim.hints``). ASTRA-
    sim has no unit per thread or stream; ``simulate --model lanes`` of the job's own files has. []
    when the replay shows no such wait or the files cannot be replayed. Cost: one replay of the job."""
    from linker.sim.cli_run import SimulateOptions, simulate

    files = _workload_files(setup)
    paths = [files[0]] if _single(files) else [files[npu] for npu in sorted(files)]
    groups = setup / "comm_groups.json"
    try:
        report = simulate(SimulateOptions(paths, ASTRA_SIM, comm_groups=groups if groups.is_file() else None)).report
    except EtLinkError:
        return []
    return [f"{note} (et-link simulate of these files)" for note in report.notes if "--model lanes" in note]


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def format_text(comparison: Comparison, output: AstraOutput, binary: Path) -> str:
    """The text ``et-link astra-run`` prints."""
    c = comparison
    lines = [f"ASTRA-sim: {binary}", f"setup: {c.setup} (cycles are ns; measured from {c.measured_from})",
             f"{'rank':>4} {'start us':>12} {'measured us':>14} {'ASTRA-sim us':>14} {'ratio':>7}"]
    for row in c.ranks:
        lines.append(f"{row.rank:>4} {_num(row.start_us):>12} {_num(row.measured_us):>14} {_num(row.astra_us):>14} "
                     f"{_ratio(row.ratio):>7}")
    what = "step" if c.single or len(c.ranks) == 1 else "job span (earliest start to latest end)"
    lines.append(f"job: measured {what} {_num(c.measured_job_us)} us, ASTRA-sim {_num(c.astra_job_us)} us "
                 f"(its last 'sys[i] finished'), ratio {_ratio(c.ratio)}")
    lines.append("  a rank's ASTRA-sim step is its 'sys[i] finished' less its start offset; ratio = ASTRA-sim / measured")
    lines += [f"  note: {note}" for note in c.notes]
    noise = output.noise_summary()
    if noise:
        lines.append(f"  ASTRA-sim's other lines (harmless, docs/astra-sim.md): {'; '.join(noise)}")
    if output.log is not None:
        lines.append(f"  whole output: {output.log}")
    return "\n".join(lines)


def to_json(comparison: Comparison, output: AstraOutput, binary: Path) -> dict:
    """The ``--json`` object: the same figures, µs (``*_us``) and ASTRA-sim's own cycles."""
    c = comparison
    return {
        "binary": str(binary), "setup": str(c.setup), "measured_from": c.measured_from, "single_rank": c.single,
        "rank_start": c.rank_start,
        "ranks": [{"rank": r.rank, "start_us": r.start_us, "measured_us": r.measured_us, "astra_sim_us": r.astra_us,
                   "astra_sim_end_us": r.astra_end_us, "ratio": r.ratio,
                   "finished_cycles": output.finished_ns[_npu(r)],
                   "exposed_communication_cycles": output.exposed_ns.get(_npu(r))} for r in c.ranks],
        "job": {"measured_us": c.measured_job_us, "astra_sim_us": c.astra_job_us, "ratio": c.ratio},
        "notes": c.notes, "other_lines": output.noise_summary(),
        "log": str(output.log) if output.log is not None else None,
    }


def _npu(row: RankRow) -> int:
    return row.rank if row.npu is None else row.npu


def astra_run(path: str | os.PathLike, binary: str | None = None, json_output: bool = False) -> str:
    """``et-link astra-run``: find the setup, check the binary, run it under the setup's folder lock,
    compare; the text (or JSON) to print. Raises ``TraceInputError`` (``AstraRunError`` when ASTRA-sim
    fails) or ``BatchSetupError`` (the folder is held by another run)."""
    from linker.batch.folder_lock import owned_folder

    setup = find_setup(path)
    exe = resolve_binary(binary)
    with owned_folder(setup, "et-link astra-run"):
        output = run_setup(setup, exe)
        comparison = compare(setup, output)
        if comparison.ratio is not None and comparison.ratio >= SLOW_RATIO:
            comparison.notes += serialization_notes(setup)
    if json_output:
        return json.dumps(to_json(comparison, output, exe), indent=2)
    return format_text(comparison, output, exe)
