#!/usr/bin/env python3
"""Benchmark et-link on a large ET + Kineto pair: wall time and peak memory next to a lazy decode.

Usage:
    python scripts/bench.py --et ET --kineto K [--repeat 3] [--forms plain,gzip] [--tricks] [--workdir DIR]
                            [--methods exact,approximate]
    python scripts/bench.py --capture DIR --torch-python /path/to/python-with-torch [--layers 48 --steps 8]

The pair is measured as plain JSON and as gzip (``--forms``): whichever form is given, the other is
made once in the work directory (gunzipped, or gzip-compressed at level 6). Each form prints its
own table, with its own decode floor.

``--capture`` first records a large pair (an ``nn.TransformerEncoder`` training loop) with
``scripts/capture_traces.py`` using a Python that has torch (``pip install torch==2.13.0``).

Every measurement runs in a fresh process; wall time is measured around it and peak RSS comes
from the child's own resource usage (``os.wait4``), as ``/usr/bin/time -v`` reports them. Lines:

- ``decode floor``: the least any linker must do: a small msgspec decode of both files (gzip
  inflated with ``gzip.decompress``) that materialises only nodes' id/name/parent and events'
  ph/cat/name/ts/dur/tid, everything else left as ``msgspec.Raw`` (not et-link's reader);
- ``floor, ISA-L inflate``: the same decode with gzip inflated by ISA-L, as et-link inflates when
  ``isal`` is installed (only then); after the table, each output's ratio to it (``x floor`` stays
  the ratio to the issue's floor);
- ``et-link -> X``: the whole command writing the ET+ as JSON, gzip JSON and Chakra ``.et``;
- ``simulate .et``: ``et-link simulate`` on that ``.et`` (when this et-link has the command).

The checkout's ``linker`` package is byte-compiled first, as ``pip install`` does for an installed
et-link: a checkout run under ``PYTHONDONTWRITEBYTECODE`` (this project's VMs set it) would otherwise
compile every module again in every run (about 0.05 s of each et-link line here).

With ``--repeat N`` the lines run in rounds (floor, JSON, JSON.gz, .et, simulate, floor, ...), each
figure is the median of its N runs, and each ratio the median of the per-round ratios to that
round's floor (pairing keeps ratios meaningful on a machine whose speed drifts).

``--tricks`` measures what each speed decision buys: per round, the CLI as it is and, for each trick,
the CLI with that trick alone turned off (``TRICKS``; a small driver applies the change in the
measured process), whole-process wall times, paired per round. A trick's figure is the median over
rounds of (off - on) / on: the share of the run it saves (negative: the trick costs time).

``--methods exact,approximate`` adds the old accuracy check: the Kineto file is copied without its
``Record function id`` args, each method links it, and its ET+ is compared op by op with the
rf_id run's (the ground truth): ``correct`` is the share of ET ops with the same ``ts``/``dur``,
``wrong`` the share linked to a different event.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DECODE_FLOOR = """
import gzip, sys
import msgspec
from msgspec import UNSET, Raw, UnsetType

class Node(msgspec.Struct):
    id: int
    name: str
    ctrl_deps: int | UnsetType = UNSET
    parent: int | UnsetType = UNSET
    inputs: Raw | UnsetType = UNSET
    outputs: Raw | UnsetType = UNSET
    attrs: Raw | UnsetType = UNSET

class EtDocument(msgspec.Struct):
    nodes: list[Node]

class Event(msgspec.Struct):
    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: float = 0.0
    dur: float = 0.0
    tid: int | str = 0
    args: Raw | UnsetType = UNSET

class KinetoDocument(msgspec.Struct):
    traceEvents: list[Event]

if sys.argv[3:] == ["isal"]:  # the same decode, gzip inflated by ISA-L (as et-link does)
    from isal import igzip as gzip

def read(path):
    with open(path, "rb") as f:
        data = f.read()
    return gzip.decompress(data) if data[:2] == b"\\x1f\\x8b" else data

et = msgspec.json.decode(read(sys.argv[1]), type=EtDocument)
kineto = msgspec.json.decode(read(sys.argv[2]), type=KinetoDocument)
print(len(et.nodes), len(kineto.traceEvents))
"""
# Exit statuses of `et-link simulate` that still mean a measured run (6: the graph got stuck).
SIMULATE_OK = (0, 6)

# Each speed decision, turned off alone: (name, output suffix it matters for, forms, what is
# measured without it). The driver below applies the change inside the measured et-link process.
TRICKS = [
    ("kineto child", "json", ("plain", "gzip"), "the Kineto trace read by this process (Schedule.kineto_child off)"),
    ("pending CPU events", "json", ("plain", "gzip"), "the child's CPU events decoded at the hand-over"),
    ("fields child", "et", ("plain", "gzip"), "the .et's ET-only fields all encoded by the writer"),
    ("background writer", "json", ("plain", "gzip"), "the writer writes each chunk itself"),
    ("one-shot exit", "json", ("plain", "gzip"), "the process collects and frees as usual at the end"),
    ("positional attrs", "json", ("plain", "gzip"), "the ET's attrs columns read by name"),
    ("ISA-L inflate", "json", ("gzip",), "gzip inflated by zlib"),
    ("output room", "json", ("plain", "gzip"), "the output's file gets its pages as it is written (Schedule.output_room off)"),
]

TRICK_DRIVER = """
import sys, zlib
from dataclasses import replace
trick = sys.argv[1]
sys.argv = ["et-link"] + sys.argv[2:]
from linker import cli, pipeline
from linker.schedule import Schedule

def schedule_without(**fields):
    auto = Schedule.auto.__func__
    Schedule.auto = classmethod(lambda cls, one_shot=True: replace(auto(cls, one_shot), **fields))

class SyncWriter:
    def __init__(self, stream, depth=8):
        self._stream, self._buffer = stream, bytearray()
    def write(self, chunk):
        self._stream.write(chunk)
    def buffer(self):
        return self._buffer
    def write_buffer(self, buffer, start, end):
        with memoryview(buffer) as view:
            self._stream.write(view[start:end])
    def close(self):
        pass

if trick == "kineto child":
    schedule_without(kineto_child=False)
elif trick == "fields child":
    schedule_without(fields_child=False)
elif trick == "output room":
    schedule_without(output_room=False)
elif trick == "pending CPU events":
    real_finish = pipeline.finish
    def eager(child):
        checked = real_finish(child)
        if checked is not None:
            checked.trace.cpu_events
        return checked
    pipeline.finish = eager
elif trick.startswith("background writer"):
    from linker.write import chakra_wire, etplus_json
    etplus_json.BackgroundWriter = chakra_wire.BackgroundWriter = SyncWriter
elif trick == "positional attrs":
    real_read = pipeline.read_execution_trace
    pipeline.read_execution_trace = lambda path, inflate_into=None: real_read(path, inflate_into, attrs_by_position=False)
elif trick == "ISA-L inflate":
    from linker.read import files
    files.inflating = zlib
elif trick not in ("none", "one-shot exit"):
    raise SystemExit("unknown trick " + trick)
if trick == "one-shot exit":
    cli.app()
else:
    cli.main()
"""


LAST_CPU = [0.0]  # CPU seconds (user + system) of the last measured process and the children it reaped


def measure(cmd: list[str], ok: tuple[int, ...] = (0,)) -> tuple[float, float, str]:
    """Run ``cmd``; return (wall seconds, peak RSS in MB, stdout+stderr); its CPU time goes to
    ``LAST_CPU``."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
    output = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) not in ok:
        raise SystemExit(f"command failed: {' '.join(cmd)}\n{output}")
    LAST_CPU[0] = usage.ru_utime + usage.ru_stime
    return wall, usage.ru_maxrss / 1024.0, output


def strip_rf_ids(src: Path, dst: Path) -> None:
    """Copy a Kineto trace without its "Record function id" args (textual, streaming-free but fast)."""
    data = gzip.decompress(src.read_bytes()) if src.read_bytes()[:2] == b"\x1f\x8b" else src.read_bytes()
    data = re.sub(rb'"Record function id":\s*-?\d+\s*,\s*', b"", data)
    data = re.sub(rb',\s*"Record function id":\s*-?\d+', b"", data)
    dst.write_bytes(data)


def load_plus(path: Path):
    import orjson

    return orjson.loads(path.read_bytes())["nodes"]


def compare(truth_path: Path, candidate_path: Path) -> tuple[int, int, int]:
    """(ops timed in the truth, same ts/dur in the candidate, different ts/dur in the candidate)."""
    truth = {n["id"]: (n.get("ts"), n.get("dur")) for n in load_plus(truth_path) if "cat" not in n}
    cand = {n["id"]: (n.get("ts"), n.get("dur")) for n in load_plus(candidate_path) if "cat" not in n}
    timed = [i for i, t in truth.items() if t[0] is not None]
    same = sum(1 for i in timed if cand.get(i) == truth[i])
    wrong = sum(1 for i in timed if cand.get(i, (None,))[0] is not None and cand[i] != truth[i])
    return len(timed), same, wrong


def capture(directory: Path, python: str, layers: int, steps: int) -> tuple[Path, Path]:
    cmd = [python, str(ROOT / "scripts" / "capture_traces.py"), "transformer", "--out", str(directory),
           "--layers", str(layers), "--steps", str(steps), "--no-check"]
    print("capturing:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return directory / "et.json.gz", directory / "kineto.json.gz"


def has_simulate() -> bool:
    """True when this et-link has the ``simulate`` command (``linker.sim``)."""
    return (ROOT / "linker" / "sim").is_dir()


ISAL_FLOOR = "floor, ISA-L inflate"


def has_isal() -> bool:
    """True when ISA-L's inflate is installed (et-link then inflates with it: ``fileio.inflating``)."""
    try:
        import isal  # noqa: F401
    except ImportError:
        return False
    return True


def other_form(path: Path, work: Path) -> Path:
    """``path`` in the other form (plain <-> gzip), made once in ``work``."""
    with open(path, "rb") as stream:
        gzipped = stream.read(2) == b"\x1f\x8b"
    name = path.name[:-3] if path.name.endswith(".gz") else path.name + ".gz"
    made = work / name
    if not made.exists():
        with open(path, "rb") as source, (gzip.open(made, "wb", compresslevel=6) if not gzipped
                                          else open(made, "wb")) as target:
            shutil.copyfileobj(gzip.GzipFile(fileobj=source) if gzipped else source, target, 1 << 20)
    return made


def forms(args, work: Path) -> dict[str, tuple[Path, Path]]:
    """The pair in each form asked for: {"plain": (et, kineto), "gzip": (et, kineto)}."""
    pairs = {}
    for path_et, path_kineto in [(args.et, args.kineto)]:
        with open(path_et, "rb") as stream:
            given = "gzip" if stream.read(2) == b"\x1f\x8b" else "plain"
        pairs[given] = (path_et, path_kineto)
        other = "plain" if given == "gzip" else "gzip"
        if other in args.forms:
            pairs[other] = (other_form(path_et, work), other_form(path_kineto, work))
    return {form: pairs[form] for form in ("plain", "gzip") if form in args.forms}


def performance_lines(et: Path, kineto: Path, work: Path) -> list[tuple[str, list[str], tuple[int, ...], Path | None]]:
    """(label, command, accepted exit codes, output file) of the measured lines, the floor first.
    The output file is removed before each run: every round writes a new file, as the first does
    (replacing the previous round's output would time the unlinking of hundreds of MB)."""
    et_link = [sys.executable, "-m", "linker.cli"]
    pair = ["--et-file", str(et), "--kineto-file", str(kineto), "-q"]
    floor = [sys.executable, "-c", DECODE_FLOOR, str(et), str(kineto)]
    lines = [("decode floor", floor, (0,), None)]
    if has_isal() and str(et).endswith(".gz"):
        lines.append((ISAL_FLOOR, floor + ["isal"], (0,), None))
    for label, name in (("et-link -> JSON", "plus.json"), ("et-link -> JSON.gz", "plus.json.gz"),
                        ("et-link -> .et", "plus.et")):
        lines.append((label, et_link + pair + ["-o", str(work / name)], (0,), work / name))
    if has_simulate():
        lines.append(("simulate .et", et_link + ["simulate", str(work / "plus.et")], SIMULATE_OK, None))
    return lines


def compile_package() -> None:
    """Write the bytecode of the checkout's ``linker`` package (``__pycache__``, ignored by git),
    as installing it would: every measured run then imports it as an installed et-link does."""
    import compileall

    if not compileall.compile_dir(ROOT / "linker", quiet=1):
        raise SystemExit("could not byte-compile linker/")


def run_performance(form: str, et: Path, kineto: Path, repeat: int, work: Path) -> None:
    lines = performance_lines(et, kineto, work)
    walls = {label: [] for label, _, _, _ in lines}
    peaks = {label: [] for label, _, _, _ in lines}
    ratios = {label: [] for label, _, _, _ in lines}
    for _ in range(repeat):
        for label, cmd, ok, output in lines:
            if output is not None:
                output.unlink(missing_ok=True)
            wall, rss, out = measure(cmd, ok)
            walls[label].append(wall)
            peaks[label].append(rss)
            ratios[label].append(wall / walls["decode floor"][-1])
            if label == "decode floor":
                nodes, events = out.split()[-2:]
    print(f"{form} inputs: {et} ({et.stat().st_size / 1e6:.1f} MB) + {kineto} "
          f"({kineto.stat().st_size / 1e6:.1f} MB): {nodes} ET nodes, {events} Kineto events; "
          f"median of {repeat} run(s) each")
    print(f"{'':<20} {'wall s':>8} {'peak MB':>9} {'x floor':>8}")
    for label, _, _, _ in lines:
        print(f"{label:<20} {statistics.median(walls[label]):8.2f} {statistics.median(peaks[label]):9.0f} "
              f"{statistics.median(ratios[label]):8.2f}", flush=True)
    if not has_simulate():
        print("simulate .et: skipped (this et-link has no `simulate` command)")
    if ISAL_FLOOR in walls:  # the ratios to the floor that inflates as et-link does
        isal_ratios = ", ".join(
            f"{label.removeprefix('et-link -> ')} {statistics.median(w / f for w, f in zip(walls[label], walls[ISAL_FLOOR])):.2f}"
            for label, _, _, output in lines if output is not None)
        print(f"x {ISAL_FLOOR}: {isal_ratios}")


def run_tricks(form: str, et: Path, kineto: Path, repeat: int, work: Path) -> None:
    """Paired whole-process runs: the CLI as it is, then with each trick off (module docstring)."""
    tricks = [t for t in TRICKS if form in t[2]]
    outputs = sorted({fmt for _, fmt, _, _ in tricks})
    pair = ["--et-file", str(et), "--kineto-file", str(kineto), "-q"]

    def run(trick: str, fmt: str) -> tuple[float, float, float]:
        output = work / f"trick.{fmt}"
        output.unlink(missing_ok=True)
        wall, rss, _ = measure([sys.executable, "-c", TRICK_DRIVER, trick] + pair + ["-o", str(output)])
        return wall, rss, LAST_CPU[0]

    on = {fmt: [] for fmt in outputs}
    off = {name: [] for name, _, _, _ in tricks}
    for _ in range(repeat):
        for fmt in outputs:
            on[fmt].append(run("none", fmt))
        for name, fmt, _, _ in tricks:
            off[name].append(run(name, fmt))
    print(f"what each speed decision buys, {form} inputs (median of {repeat} paired round(s); "
          "saves = (off - on) / on, wall and CPU):")
    print(f"{'trick':<24} {'out':<5} {'on s':>7} {'off s':>7} {'saves':>7} {'CPU on':>7} {'CPU off':>7} "
          f"{'saves':>7} {'peak on/off MB':>15}")

    def median(runs, k):
        return statistics.median(run[k] for run in runs)

    for name, fmt, _, what in tricks:
        saves = statistics.median((o[0] - n[0]) / n[0] for n, o in zip(on[fmt], off[name]))
        cpu_saves = statistics.median((o[2] - n[2]) / n[2] for n, o in zip(on[fmt], off[name]))
        print(f"{name:<24} {fmt:<5} {median(on[fmt], 0):7.2f} {median(off[name], 0):7.2f} {100 * saves:6.1f}% "
              f"{median(on[fmt], 2):7.2f} {median(off[name], 2):7.2f} {100 * cpu_saves:6.1f}% "
              f"{median(on[fmt], 1):7.0f}/{median(off[name], 1):<7.0f}  off: {what}", flush=True)


def run_methods(args, work: Path) -> None:
    """The accuracy check of ``--methods`` (see the module docstring)."""
    et_link = [sys.executable, "-m", "linker.cli"]
    stripped = work / "kineto_no_rf_ids.json"
    methods = ["rf_id"] + [m for m in args.methods.split(",") if m and m != "rf_id"]
    # In a child: this process stays small (a child's peak RSS counts the parent's at fork).
    subprocess.run([sys.executable, __file__, "--strip-into", str(stripped), "--kineto", str(args.kineto)],
                   check=True)
    outputs = {}
    for method in methods:
        kineto = args.kineto if method == "rf_id" else stripped
        out_path = work / f"plus_{method}.json"
        wall, rss, _ = measure(et_link + ["--et-file", str(args.et), "--kineto-file", str(kineto),
                                          "--match", method, "-o", str(out_path), "-q"])
        outputs[method] = out_path
        print(f"{'et-link --match ' + method:<28} {wall:8.2f} s {rss:9.0f} MB", flush=True)
    # Compared only after every measurement (see above).
    for method in methods[1:]:
        timed, same, wrong = compare(outputs["rf_id"], outputs[method])
        print(f"{method:<10} vs rf_id ground truth: correct {100 * same / timed:.3f}%  "
              f"wrong {100 * wrong / timed:.3f}% of {timed} ops")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--et", type=Path)
    parser.add_argument("--kineto", type=Path)
    parser.add_argument("--capture", type=Path, help="capture a large pair into this directory first")
    parser.add_argument("--torch-python", default=sys.executable, help="a Python with torch, for --capture")
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1, help="rounds of measurements (medians are printed)")
    parser.add_argument("--forms", default="plain,gzip", help="input forms to measure: plain, gzip, or plain,gzip "
                        "(the default: both)")
    parser.add_argument("--tricks", action="store_true", help="measure each speed decision (paired runs)")
    parser.add_argument("--methods", default="", help="also check these linking methods' accuracy, "
                        "e.g. exact,approximate")
    parser.add_argument("--workdir", type=Path, help="where outputs go (default: a temporary directory)")
    parser.add_argument("--strip-into", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.strip_into:
        strip_rf_ids(args.kineto, args.strip_into)
        return 0
    if args.capture:
        args.et, args.kineto = capture(args.capture, args.torch_python, args.layers, args.steps)
    if not (args.et and args.kineto):
        parser.error("give --et and --kineto, or --capture DIR")
    if not {"plain", "gzip"} & set(args.forms.split(",")):
        parser.error(f"--forms {args.forms!r}: name plain, gzip or both (plain,gzip)")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="et-link-bench."))
    work.mkdir(parents=True, exist_ok=True)
    try:
        compile_package()
        for form, (et, kineto) in forms(args, work).items():
            if args.tricks:
                run_tricks(form, et, kineto, args.repeat, work)
            else:
                run_performance(form, et, kineto, args.repeat, work)
        if args.methods:
            run_methods(args, work)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
