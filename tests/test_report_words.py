"""What the report and the page call things (issue "A user's first hour", items 2 and 4): a capture
of several iterations is named as such, with its measured mean per iteration; the page lists the
critical path's drift places as ``--explain`` does, with each list saying what it measures."""

from __future__ import annotations

import re

import orjson
import pytest

import linker
from conftest import FIXTURES

MLP = (FIXTURES / "cpu" / "mlp_steps" / "et.json.gz", FIXTURES / "cpu" / "mlp_steps" / "kineto.json.gz")


@pytest.fixture(scope="module")
def mlp_output(tmp_path_factory):
    out = tmp_path_factory.mktemp("mlp") / "mlp.json"
    linker.write_et_plus(linker.link_traces(*MLP), out)
    return out


def test_a_capture_of_three_iterations_says_so(mlp_output):
    nodes = orjson.loads(mlp_output.read_bytes())["nodes"]
    steps = sorted((n["ts"], n["name"], n["dur"]) for n in nodes
                   if n["name"].startswith("ProfilerStep#") and "continues" not in n)
    assert len(steps) == 3
    mean = sum(dur for _, _, dur in steps) / 3
    report = linker.simulate(mlp_output).report
    assert report.iterations == 3 and report.iteration_names == [steps[0][1], steps[-1][1]]
    assert report.measured_iteration_us == pytest.approx(mean)
    line = linker.simulate(mlp_output).text().splitlines()[1]
    assert line.startswith(f"captured span (3 iterations, {steps[0][1]} to {steps[-1][1]}; measured ")
    assert "per iteration on average): measured 13.84 ms" in line


def test_the_page_lists_the_critical_paths_drift_as_explain_does(mlp_output, tmp_path):
    pytest.importorskip("plotly", reason="needs plotly (pip install 'et-link[view]')")
    simulation = linker.simulate(mlp_output, scale="cpu=0.5")  # a what-if: the path drifts
    page_path = tmp_path / "page.html"
    simulation.write_html(page_path)
    page = page_path.read_text()
    explained = linker.simulate(mlp_output, top=10, scale="cpu=0.5")
    from linker.sim.explain import drift_report

    drift = drift_report(explained.replay, 10, explained.path)
    expected = ([drift["first"]["id"]] if drift["first"] else []) + [p["id"] for p in drift["largest"]]
    section = page.split("where the replay drifts along the critical path", 1)[1].split("</table>", 1)[0]
    shown = [int(cell) for cell in re.findall(r"<tr><td>(?:first|largest)</td><td>(\d+)</td>", section)]
    assert shown == expected and shown
    assert "et-link simulate --explain" in section
    assert "landmark" not in page  # the per-lane list in plain words
    assert "where each lane gains or loses time" in page


def test_the_critical_paths_rows_shorten_a_kernels_long_name(tmp_path):
    """A C++ kernel's name runs to hundreds of characters: the text's critical-path row gives it with
    its template arguments and parameters elided, the JSON report in full."""
    from sim_graphs import cpu, gpu, write_et

    name = "void fbgemm::split_embedding_kernel<float, float, 2ul>(" + ", ".join(["at::Accessor<float, 1ul>"] * 20) + ")"
    path = write_et(tmp_path / "long.et", [cpu(1, 10, start=0), gpu(2, 50, deps=[1], start=10, name=name)])
    simulation = linker.simulate(path)
    row = next(line for line in simulation.text().splitlines() if "gpu " in line and "fbgemm" in line)
    assert row.endswith("void fbgemm::split_embedding_kernel<…>") and name not in row
    assert any(op.name == name for op in simulation.report.critical_path)


def test_the_page_says_so_when_no_op_of_the_path_moves(tmp_path):
    """A replay that keeps the measured timing along its path but for the rounding: no drift row,
    and the page says why (as ``--explain`` does)."""
    pytest.importorskip("plotly", reason="needs plotly (pip install 'et-link[view]')")
    from sim_graphs import cpu, write_et

    # Measured A 100-110, B 111-121: replayed back to back, B starts 1 µs early (a jump under 2 µs).
    path = write_et(tmp_path / "r.et", [cpu(1, 10, start=100), cpu(2, 10, [1], start=111)])
    page_path = tmp_path / "page.html"
    linker.simulate(path).write_html(page_path)
    section = page_path.read_text().split("where the replay drifts along the critical path", 1)[1]
    assert "<td>largest</td>" not in section.split("</table>", 1)[0]
    assert "No op of the path drifts by more than 1 µs, and no jump reaches 2 µs" in section
