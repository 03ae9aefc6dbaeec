"""The job's network in ``summary.json`` (``simulator.network``) and in the printed table:

- ``fitted``: the network of each backend's collectives as ``et-link simulate --network`` fits it
  (``sim.network.fit_job``: CPU collectives on a bus, GPU ones on links; bandwidth, latency,
  episodes, mean error), from the job's graphs as loaded; always written for a job whose graphs
  are read (``--format et``), an empty list when no collective carries bytes;
- ``what_if`` (``et-link batch --network bandwidth=RATE[,latency=TIME][,medium=bus|links]``):
  ``et-link simulate DIR --network ...`` of the written outputs: the measured job span, the
  predicted one, their ratio, and ``NetworkWhatIf.to_json`` (the link asked about, the network
  part of the collectives as measured and on the given link, per kind of collective).

docs/whatif.md says what a what-if moves and keeps. Cost: the fit is O(c log c) over the job's c
collectives (one matching, no replay) and 8 bytes a node for the durations; the what-if is one
``simulate`` of the written outputs (their loads and three replays).
"""

from __future__ import annotations

from array import array
from pathlib import Path

from linker.sim.engine import match_communication, node_offsets
from linker.sim.network import FittedNetwork, fit_job, format_rate


def fitted_networks(graphs: list, comm_groups: dict[str, list[int]] | None) -> list[FittedNetwork]:
    """Each backend's fitted network of the job ``graphs`` (``sim.load`` graphs in rank order);
    [] for a single rank (its collectives' group sizes and waits for peers are not in one file)
    or when no collective carries bytes. O(c log c)."""
    if len(graphs) < 2:
        return []
    offsets = node_offsets(graphs)
    groups = match_communication(graphs, offsets, comm_groups)
    duration = array("d")
    for graph in graphs:
        duration.extend(graph.duration)
    job = fit_job(graphs, offsets, groups, duration)
    return [fit for fit in job.fits.values() if fit is not None]


def what_if(output_dir: Path, network: str) -> dict:
    """``et-link simulate output_dir --network network`` as a record: ``given``, ``measured_us`` (the
    job span), ``predicted_us``, ``predicted_over_measured``, ``network`` (the what-if's
    ``NetworkWhatIf.to_json``). Raises what ``simulate`` raises on unreadable outputs."""
    from linker.sim.cli_run import SimulateOptions, simulate

    report = simulate(SimulateOptions([Path(output_dir)], network=network)).report
    return {"given": network, "measured_us": round(report.measured_us, 3),
            "predicted_us": round(report.simulated_us, 3),
            "predicted_over_measured": round(report.ratio, 4) if report.ratio is not None else None,
            "network": report.network.to_json()}


def network_record(fitted: list[dict], predicted: dict | None) -> dict:
    """``summary.json``'s ``simulator.network``: ``fitted`` (``FittedNetwork.to_json`` each) and
    ``what_if`` (``what_if``'s record, or None without ``--network``)."""
    return {"fitted": fitted, "what_if": predicted}


def network_lines(record: dict) -> list[str]:
    """The printed lines of ``network_record``'s record: one per fitted network, the what-if's answer."""
    out = []
    for fit in record["fitted"]:
        told = "" if fit["latency_told_apart"] else " (one message mix: latency not told apart)"
        out.append(f"network of the {fit['backend']} collectives ({fit['medium']}, as simulate --network fits it): "
                   f"{fit['bandwidth']}, latency {fit['latency_us']:,.1f} us{told}; {fit['collectives']} collectives "
                   f"in {fit['episodes']} episodes, {100 * fit['mean_abs_error']:.1f}% mean error")
    predicted = record["what_if"]
    if predicted is not None:
        network = predicted["network"]
        ratio = predicted["predicted_over_measured"]
        out.append(f"network what-if {format_rate(network['given']['bandwidth_bytes_per_s'])} ({predicted['given']}): "
                   f"job span measured {predicted['measured_us'] / 1000:,.1f} ms, predicted "
                   f"{predicted['predicted_us'] / 1000:,.1f} ms" + (f" (x{ratio:.3f})" if ratio is not None else "")
                   + f"; network time {network['measured_network_us'] / 1000:,.2f} -> "
                   f"{network['what_if_network_us'] / 1000:,.2f} ms over {network['retimed_collectives']} collectives")
    return out
