"""The library API (``linker.link_traces``, ``write_et_plus``, ``simulate``, ``link_job``, the tables) agrees with the
commands, stays light to import, and the example script runs."""

from __future__ import annotations

import builtins
import gzip
import os
import shutil
import subprocess
import sys
from collections import Counter

import orjson
import pytest
from typer.testing import CliRunner

import linker
from conftest import FIXTURES, ROOT, fixture_pair
from linker.cli import app
from linker.write.validate import validate_file

GPU_PAIR = fixture_pair("gpu", "gpu_v111")


def test_import_linker_loads_no_other_module_of_it():
    code = "import sys, linker; print(sorted(m for m in sys.modules if m.startswith(('linker.', 'orjson', 'pandas', 'plotly', 'rich'))))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_link_write_simulate_give_what_the_commands_give(tmp_path):
    result = linker.link_traces(*GPU_PAIR)
    outcome = linker.write_et_plus(result, tmp_path / "lib.et", tmp_path / "lib.json")
    assert validate_file(outcome.output).ok
    cli = CliRunner().invoke(app, ["--et-file", str(GPU_PAIR[0]), "--kineto-file", str(GPU_PAIR[1]),
                                   "-o", str(tmp_path / "cli.et"), "--report", str(tmp_path / "cli.json"), "-q"])
    assert cli.exit_code == 0, cli.output
    assert (tmp_path / "lib.et").read_bytes() == (tmp_path / "cli.et").read_bytes()
    lib_report = orjson.loads((tmp_path / "lib.json").read_bytes())
    cli_report = orjson.loads((tmp_path / "cli.json").read_bytes())
    for key in ("linked_ops", "et_ops", "gpu_events_linked", "warnings", "dependencies", "gpu_accounting"):
        assert lib_report[key] == cli_report[key], key
    assert result.report.linked_ops == cli_report["linked_ops"]  # the typed report is the JSON's
    simulation = linker.simulate(outcome.output)
    printed = orjson.loads(CliRunner().invoke(app, ["simulate", str(tmp_path / "cli.et"), "--json"]).stdout)
    assert simulation.to_json()["simulated_us"] == printed["simulated_us"]
    assert simulation.report.ratio == printed["ratio"] and simulation.text().startswith("simulate: 1 rank")


def test_link_rejects_an_unknown_method():
    with pytest.raises(ValueError, match="unknown method"):
        linker.link_traces(*GPU_PAIR, method="fastest")


def test_simulation_writes_the_commands_outputs(tmp_path):
    result = linker.link_traces(*GPU_PAIR)
    simulation = linker.simulate(linker.write_et_plus(result, tmp_path / "p.et").output)
    simulation.write_trace(tmp_path / "t.json.gz")
    assert orjson.loads(gzip.decompress((tmp_path / "t.json.gz").read_bytes()))["traceEvents"]
    pytest.importorskip("plotly", reason="needs plotly (pip install 'et-link[view]')")
    simulation.write_html(tmp_path / "v.html")
    assert "Plotly.newPlot" in (tmp_path / "v.html").read_text()


def test_batch_links_every_rank(tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    for rank, name in enumerate(("mlp_steps", "dataloader")):
        shutil.copyfile(FIXTURES / "cpu" / name / "et.json.gz", traces / f"rank{rank}.et.json.gz")
        shutil.copyfile(FIXTURES / "cpu" / name / "kineto.json.gz", traces / f"rank{rank}.kineto.json.gz")
    summary = linker.link_job(str(traces / "rank*.kineto.json.gz"), tmp_path / "out", et=str(traces / "rank*.et.json.gz"),
                           workers=1)
    assert [(r.rank, r.status) for r in summary.ranks] == [(0, "linked"), (1, "linked")]
    assert (tmp_path / "out" / "summary.json").is_file()


# --- tables ----------------------------------------------------------------------------------------


def raw_gpu_events(kineto) -> list[dict]:
    doc = orjson.loads(gzip.decompress(kineto.read_bytes()))
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]


def test_tables_of_a_link():
    pytest.importorskip("pandas", reason="needs pandas")
    result = linker.link_traces(*GPU_PAIR)
    ops = linker.ops_table(result)
    et = orjson.loads(gzip.decompress(GPU_PAIR[0].read_bytes()))
    assert len(ops) == result.report.et_ops and int(ops["linked"].sum()) == result.report.linked_ops
    assert set(ops["id"]) <= {node["id"] for node in et["nodes"]}
    linked = ops[ops["linked"]]
    assert (linked["exclusive_us"] <= linked["dur_us"] + 1e-6).all()
    gpu = linker.gpu_events_table(result)
    raw = raw_gpu_events(GPU_PAIR[1])
    assert sorted(gpu["name"]) == sorted(e["name"] for e in raw)
    assert dict(Counter(gpu["reason"])) == {row["reason"]: row["count"] for row in result.report.gpu_accounting}


def test_critical_path_table_tiles_the_simulated_time(tmp_path):
    pytest.importorskip("pandas", reason="needs pandas")
    simulation = linker.simulate(linker.write_et_plus(linker.link_traces(*GPU_PAIR), tmp_path / "p.et").output)
    path = simulation.critical_path_table()
    assert path["start_us"].iloc[0] == 0 and path["end_us"].iloc[-1] == simulation.report.simulated_us
    # each node starts when the one before it ends, or a measured wait later
    assert (path["start_us"].iloc[1:].to_numpy() == path["end_us"].iloc[:-1].to_numpy()
            + path["held_us"].iloc[1:].to_numpy()).all()
    assert ((path["held_us"] > 0) == (path["held_cause"] != "")).all()
    nodes = simulation.nodes_table()
    assert len(nodes) == simulation.report.ranks[0].nodes


def test_tables_without_pandas_say_how_to_get_it(monkeypatch):
    real_import = builtins.__import__

    def no_pandas(name, *args, **kwargs):
        if name == "pandas":
            raise ImportError("no pandas")
        return real_import(name, *args, **kwargs)

    result = linker.link_traces(*GPU_PAIR)
    monkeypatch.setattr(builtins, "__import__", no_pandas)
    with pytest.raises(ImportError, match="pip install pandas"):
        linker.ops_table(result)


def test_the_example_script_runs(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "library_example.py")], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("linked 62 of 63 ET ops by rf_id")
    try:
        import pandas  # noqa: F401  (is it installed?)
    except ImportError:
        assert "pandas is not installed" in proc.stdout
    else:
        assert "GPU events by reason:" in proc.stdout and "critical path time by kind" in proc.stdout
