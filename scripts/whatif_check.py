#!/usr/bin/env python3
"""Check network what-ifs against measured runs: one DDP-over-gloo job captured at several
loopback rates, each slowed run predicted from the unlimited trace and the reverse.

Usage (as root, for ``tc``; ``--python``: a Python with torch, used only for the captures):

    PYTHONPATH=. python scripts/whatif_check.py --out DIR --python PY [--ranks 2 4]
        [--rates unlimited 2gbit 1gbit 500mbit] [--reuse] [--medium bus|links] [--json]
        [--layers 4 --width 256 --batch 32 --bucket-mb 0.6] [--model mlp|conv|fsdp|pipeline] [--zero]
        [--cross EARLIER_DIR ...]

For each rank count and rate it captures ``scripts/capture_ddp.py``'s job into
``DIR/r<RANKS>_<RATE>`` with the loopback limited by ``tc qdisc add dev lo root tbf rate RATE
burst 256kb latency 100ms`` (unlimited: no qdisc), and removes the limit again whatever happens
(``try/finally``, SIGTERM included); it refuses to start when ``lo`` already has a root qdisc it did
not add. ``--reuse`` keeps captures already there (no root needed then). Each job is linked as
``et-link batch --format et`` links it (``linker.link_job``) into ``DIR/r<RANKS>_<RATE>/linked``,
then replayed (``linker.simulate``):

- its own replay (``ratio``: simulated / measured job span);
- the fitted network of its gloo collectives (``--network``'s fit, on a bus unless ``--medium``);
- from the unlimited trace, ``--network bandwidth=RATE`` for each slowed rate, against the slowed
  run's measured job span (earliest start to latest end over the ranks);
- from each slowed trace, ``--network bandwidth=B`` with B the unlimited trace's fitted rate (the
  unlimited loopback as the trace shows it), against the unlimited run's measured job span.

Where ``ASTRA_SIM_BIN`` is set (one binary, or several joined by ``:``, e.g. both analytical
backends), the same predictions are made in the real ASTRA-sim: each job's workload copies written
with ``--astra-cpu-collectives network`` (``astra-setup``; the gloo collectives carried on the
fitted bus, docs/whatif.md) and ``network.yml``'s bandwidth set to the bus rate asked about / N
(``--astra-bandwidth``, GB/s of 2^30 bytes); ASTRA-sim's job span is its last ``sys[i]
finished``. Per job it also runs the copies on their own fitted network (``own network``) and the
default copies (``own measured``: the meeting, then the measured time) for their replay of the
trace. A second table lists these (``--json``: ``astra`` per row). ``--cross`` names earlier
capture folders of the same job: a third table gives, per rank count and rate, the mean error and
mean absolute error over every cross-pair of the sets (each unlimited run predicting each slowed
run, and back; ``--json``: ``cross_pairs``), with how the errors go with the CPU time the two
runs of a pair spent (the what-if keeps the source run's).

Prints one table (``--json``: one object). Cost: a capture is a few seconds of torchrun per job;
linking and replaying a job well under a second per rank; an ASTRA-sim run about a second.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TC = "/usr/sbin/tc" if Path("/usr/sbin/tc").exists() else "tc"
UNLIMITED = "unlimited"


def lo_qdisc() -> str:
    """``tc qdisc show dev lo`` as printed."""
    return subprocess.run([TC, "qdisc", "show", "dev", "lo"], capture_output=True, text=True, check=True).stdout


def restore_loopback() -> None:
    """Remove the root qdisc of ``lo`` (the kernel's default comes back); quiet when none."""
    subprocess.run([TC, "qdisc", "del", "dev", "lo", "root"], capture_output=True, text=True)


def capture(args: argparse.Namespace, ranks: int, rate: str, out: Path) -> None:
    """Capture one job at ``rate`` into ``out``; the loopback is restored before returning or raising."""
    command = [args.python, str(ROOT / "scripts" / "capture_ddp.py"), "--out", str(out), "--ranks", str(ranks),
               "--layers", str(args.layers), "--width", str(args.width), "--batch", str(args.batch),
               "--bucket-mb", str(args.bucket_mb), "--seed", str(args.seed), "--model", args.model]
    if args.zero:
        command.append("--zero")
    try:
        if rate != UNLIMITED:
            subprocess.run([TC, "qdisc", "add", "dev", "lo", "root", "tbf", "rate", rate, "burst", "256kb",
                            "latency", "100ms"], check=True)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    finally:
        if rate != UNLIMITED:
            restore_loopback()


def linked(job: Path) -> Path:
    """The job linked to ``.et`` (``et-link batch --format et``), once."""
    from linker import link_job

    target = job / "linked"
    if not (target / "summary.json").exists():
        suffix = ".gz" if (job / "host.0.json.gz").exists() else ""
        link_job(str(job / f"device.*.json{suffix}"), target, str(job / f"host.*.json{suffix}"), fmt="et", workers=1)
    return target


def replayed(job_et: Path, network: str = "") -> dict:
    """``et-link simulate`` of a linked job as JSON (with ``--network`` when given)."""
    from linker import simulate

    return simulate(job_et, network=network).to_json()


def astra_binaries() -> list[Path]:
    """The binaries of ``ASTRA_SIM_BIN`` (several joined by ``:``); [] when it is not set."""
    return [Path(part) for part in os.environ.get("ASTRA_SIM_BIN", "").split(os.pathsep) if part]


def astra_span_us(job_et: Path, setup: Path, binary: Path, form: str, bus_rate: float | None, ranks: int) -> float:
    """ASTRA-sim's job span (µs: its last ``sys[i] finished``) of a linked job's setup written into
    ``setup`` (``astra-setup``) with its CPU collectives in ``form``; ``bus_rate`` (bytes/s): the
    bus asked about, written as links of rate / ``ranks`` (None: the fitted network)."""
    from linker.batch.astra_run import run_setup
    from linker.batch.astra_setup import setup_for_files

    overrides = {"cpu_collectives": form} if form != "measured" else {}
    if bus_rate is not None:
        overrides["bandwidth_gbps"] = bus_rate / ranks / 2 ** 30
    setup_for_files([job_et], setup, overrides)
    return max(run_setup(setup, binary).finished_ns.values()) / 1000


def astra_row(row: dict, fast: Path, job: Path, fast_rate: float, fast_measured: float, binary: Path) -> dict:
    """One binary's figures for one row of the table (``main``): own replays in both forms, and the
    predictions from the unlimited job and back to it, with their errors."""
    ranks, rate = row["ranks"], row["loopback"]
    work = job / "astra_check" / binary.name
    own_measured = astra_span_us(job, work / "own_measured", binary, "measured", None, ranks)
    own_network = astra_span_us(job, work / "own_network", binary, "network", None, ranks)
    out = {"own_measured": round(own_measured / row["measured_us"], 4),
           "own_network": round(own_network / row["measured_us"], 4),
           "from_unlimited_us": None, "from_unlimited_error": None, "to_unlimited_us": None,
           "to_unlimited_error": None}
    if rate != UNLIMITED:
        from linker.sim.network import parse_rate

        forward = astra_span_us(fast, fast / "astra_check" / binary.name / f"to_{rate}", binary, "network",
                                parse_rate(rate), ranks)
        back = astra_span_us(job, work / "to_unlimited", binary, "network", fast_rate, ranks)
        out.update(from_unlimited_us=round(forward, 1), from_unlimited_error=round(forward / row["measured_us"] - 1, 4),
                   to_unlimited_us=round(back, 1), to_unlimited_error=round(back / fast_measured - 1, 4))
    return out


def cross_pairs(folders: list[Path], ranks_list: list[int], rates: list[str], medium: str) -> list[dict]:
    """Over several capture sets of one job (each folder as ``--out`` fills it): for each rank count
    and slowed rate, every unlimited run predicting every slowed run and back, in ``simulate``; the
    mean error and the mean absolute error of each direction. A pair's two runs differ by the
    network and by whatever else the host did to them, so the spread says how far one pair can be
    trusted. What a what-if keeps as measured, the CPU time, is set beside it: per direction the
    correlation of a pair's error with the CPU busy time its target run spent beyond its source
    run (per rank, as a share of the target's span; ``cpu_beyond``) and the error a least-squares
    line gives at equal CPU time (``at_equal_cpu``)."""
    rows = []
    for ranks in ranks_list:
        fast = [linked(folder / f"r{ranks}_{UNLIMITED}") for folder in folders]
        fast_reports = [replayed(job, f"bandwidth=1Gbit/s{medium}") for job in fast]
        fast_cpu = [replayed(job)["busy_us"]["cpu"] / ranks for job in fast]
        for rate in rates[1:]:
            slow = [linked(folder / f"r{ranks}_{rate}") for folder in folders]
            slow_own = [replayed(job) for job in slow]
            slow_measured = [report["measured_us"] for report in slow_own]
            slow_cpu = [report["busy_us"]["cpu"] / ranks for report in slow_own]
            forward, back, forward_cpu, back_cpu = [], [], [], []
            for job, report, cpu in zip(fast, fast_reports, fast_cpu):
                predicted = replayed(job, f"bandwidth={rate}{medium}")["simulated_us"]
                forward += [predicted / measured - 1 for measured in slow_measured]
                forward_cpu += [(other_cpu - cpu) / measured for other_cpu, measured in zip(slow_cpu, slow_measured)]
                fast_rate = report["network"]["fitted"][0]["bandwidth_bytes_per_s"]
                back += [replayed(other, f"bandwidth={fast_rate}B/s{medium}")["simulated_us"] / report["measured_us"] - 1
                         for other in slow]
                back_cpu += [(cpu - other_cpu) / report["measured_us"] for other_cpu in slow_cpu]
            row = {"ranks": ranks, "loopback": rate, "pairs": len(forward)}
            for name, errors, cpu_beyond in (("from_unlimited", forward, forward_cpu), ("to_unlimited", back, back_cpu)):
                row[f"{name}_mean"] = round(sum(errors) / len(errors), 4)
                row[f"{name}_mae"] = round(sum(map(abs, errors)) / len(errors), 4)
                row[f"{name}_vs_cpu"] = _against_cpu(errors, cpu_beyond)
            rows.append(row)
    return rows


def _against_cpu(errors: list[float], cpu_beyond: list[float]) -> dict | None:
    """The errors' correlation with the target's CPU time beyond the source's, and the error at
    equal CPU time (the least-squares line's intercept); None where either does not vary."""
    if len(errors) < 2 or len(set(errors)) < 2 or len(set(cpu_beyond)) < 2:
        return None
    line = statistics.linear_regression(cpu_beyond, errors)
    return {"correlation": round(statistics.correlation(cpu_beyond, errors), 3),
            "at_equal_cpu": round(line.intercept, 4), "slope": round(line.slope, 3),
            "cpu_beyond_mean": round(sum(cpu_beyond) / len(cpu_beyond), 4)}


def _vs_cpu(figures: dict | None) -> str:
    return "-" if figures is None else f"{figures['correlation']:+.2f}, {pct(figures['at_equal_cpu'])}"


def ms(us: float | None) -> str:
    return f"{us / 1000:,.1f} ms" if us is not None else "-"


def pct(x: float | None) -> str:
    return f"{100 * x:+.1f}%" if x is not None else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder of the captures (r<RANKS>_<RATE>/)")
    parser.add_argument("--python", default="python", help="a Python with torch, for the captures")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rates", nargs="+", default=[UNLIMITED, "2gbit", "1gbit", "500mbit"],
                        help="tc rates; the first must be 'unlimited'")
    parser.add_argument("--reuse", action="store_true", help="keep captures already in --out")
    parser.add_argument("--medium", choices=("bus", "links"), default=None, help="the what-if's medium (default bus)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--bucket-mb", type=float, default=0.6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", choices=("mlp", "conv", "fsdp", "pipeline"), default="mlp",
                        help="capture_ddp.py's model: DDP of an MLP or a conv net, FSDP2 of the MLP, or a pipeline of its layers (send / recv)")
    parser.add_argument("--zero", action="store_true", help="capture_ddp.py's --zero (ZeroRedundancyOptimizer)")
    parser.add_argument("--cross", type=Path, nargs="+", default=[],
                        help="earlier capture folders of the same job (as --out filled them): also print the "
                             "errors over every cross-pair of --out and these (simulate)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.rates[0] != UNLIMITED:
        parser.error("the first rate must be 'unlimited' (the predictions start from it)")
    from linker.sim.network import parse_rate

    medium = f",medium={args.medium}" if args.medium else ""
    jobs = {(ranks, rate): args.out / f"r{ranks}_{rate}" for ranks in args.ranks for rate in args.rates}
    missing = [key for key, job in jobs.items()
               if not (args.reuse and any((job / name).exists() for name in ("host.0.json", "host.0.json.gz")))]
    if missing:
        current = lo_qdisc().strip()
        if "noqueue" not in current:
            raise SystemExit(f"whatif_check: lo already has a qdisc ({current}); remove it first")
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the finally clauses run
        args.out.mkdir(parents=True, exist_ok=True)
        try:
            for ranks, rate in missing:
                print(f"capturing {ranks} ranks at {rate}", file=sys.stderr)
                capture(args, ranks, rate, jobs[(ranks, rate)])
        finally:
            restore_loopback()
            print(f"lo restored: {lo_qdisc().strip()}", file=sys.stderr)
    rows = []
    binaries = astra_binaries()
    for ranks in args.ranks:
        fast = linked(jobs[(ranks, UNLIMITED)])
        fast_report = replayed(fast, f"bandwidth=1Gbit/s{medium}")
        fast_fit = fast_report["network"]["fitted"][0]
        fast_rate = fast_fit["bandwidth_bytes_per_s"]
        for rate in args.rates:
            job = linked(jobs[(ranks, rate)])
            own = replayed(job)
            fit = replayed(job, f"bandwidth=1Gbit/s{medium}")["network"]["fitted"][0] if rate != UNLIMITED else fast_fit
            row = {"ranks": ranks, "loopback": rate, "measured_us": own["measured_us"], "own_ratio": own["ratio"],
                   "fitted_bandwidth": fit["bandwidth"], "fitted_over_rate": None,
                   "from_unlimited_us": None, "from_unlimited_error": None, "to_unlimited_us": None,
                   "to_unlimited_error": None}
            if rate != UNLIMITED:
                row["fitted_over_rate"] = round(fit["bandwidth_bytes_per_s"] / parse_rate(rate), 3)
                forward = replayed(fast, f"bandwidth={rate}{medium}")
                row["from_unlimited_us"] = forward["simulated_us"]
                row["from_unlimited_error"] = round(forward["simulated_us"] / own["measured_us"] - 1, 4)
                back = replayed(job, f"bandwidth={fast_rate}B/s{medium}")
                row["to_unlimited_us"] = back["simulated_us"]
                row["to_unlimited_error"] = round(back["simulated_us"] / fast_report["measured_us"] - 1, 4)
            if binaries:
                row["astra"] = {binary.name: astra_row(row, fast, job, fast_rate, fast_report["measured_us"], binary)
                                for binary in binaries}
            rows.append(row)
    cross = cross_pairs([args.out, *args.cross], args.ranks, args.rates, medium) if args.cross else []
    if args.json:
        print(json.dumps({"medium": args.medium or "bus", "rows": rows, "cross_pairs": cross}, indent=1))
        return 0
    print(f"medium: {args.medium or 'bus'}; 'fitted' is the trace's own gloo network (its fitted/tbf rate)")
    print(f"{'ranks':>5}  {'loopback':>9}  {'measured':>10}  {'own':>6}  {'fitted':>16}  "
          f"{'from unlimited':>15}  {'error':>7}  {'to unlimited':>13}  {'error':>7}")
    for row in rows:
        fitted = row["fitted_bandwidth"] + (f" ({row['fitted_over_rate']:.2f})" if row["fitted_over_rate"] else "")
        print(f"{row['ranks']:>5}  {row['loopback']:>9}  {ms(row['measured_us']):>10}  {row['own_ratio']:>6.3f}  "
              f"{fitted:>16}  {ms(row['from_unlimited_us']):>15}  {pct(row['from_unlimited_error']):>7}  "
              f"{ms(row['to_unlimited_us']):>13}  {pct(row['to_unlimited_error']):>7}")
    if binaries:
        print("\nASTRA-sim (CPU collectives carried on the fitted bus: --astra-cpu-collectives network; 'own' = "
              "ASTRA-sim / measured job span of the job's own setup, default form and network form)")
        print(f"{'binary':>20}  {'ranks':>5}  {'loopback':>9}  {'own meas.':>9}  {'own netw.':>9}  "
              f"{'from unlimited':>15}  {'error':>7}  {'to unlimited':>13}  {'error':>7}")
        for row in rows:
            for name, figures in row["astra"].items():
                short = name.replace("AstraSim_Analytical_", "")
                print(f"{short:>20}  {row['ranks']:>5}  {row['loopback']:>9}  {figures['own_measured']:>9.4f}  "
                      f"{figures['own_network']:>9.4f}  {ms(figures['from_unlimited_us']):>15}  "
                      f"{pct(figures['from_unlimited_error']):>7}  {ms(figures['to_unlimited_us']):>13}  "
                      f"{pct(figures['to_unlimited_error']):>7}")
    if cross:
        print(f"\ncross-pairs of {1 + len(args.cross)} capture sets (simulate; mean error, mean absolute error; "
              f"'vs CPU': the errors' correlation with the CPU time the target run spent beyond the source, "
              f"and the error at equal CPU time)")
        print(f"{'ranks':>5}  {'loopback':>9}  {'pairs':>5}  {'from unlimited':>16}  {'vs CPU':>14}  "
              f"{'to unlimited':>16}  {'vs CPU':>14}")
        for row in cross:
            print(f"{row['ranks']:>5}  {row['loopback']:>9}  {row['pairs']:>5}  "
                  f"{pct(row['from_unlimited_mean']):>7}, {100 * row['from_unlimited_mae']:5.1f}%  "
                  f"{_vs_cpu(row['from_unlimited_vs_cpu']):>14}  "
                  f"{pct(row['to_unlimited_mean']):>7}, {100 * row['to_unlimited_mae']:5.1f}%  "
                  f"{_vs_cpu(row['to_unlimited_vs_cpu']):>14}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
