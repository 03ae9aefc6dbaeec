"""``linker.model.chakra_kinds`` holds Chakra's enum values as ``schema/et_def.proto`` defines them,
and a JSON run does not load protobuf (the reason the module exists)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from linker.model import chakra_kinds, et_def_pb2

ROOT = Path(__file__).resolve().parents[1]


def test_every_value_is_the_generated_modules():
    for name in ("COMP_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_COLL_NODE"):
        assert getattr(chakra_kinds, name) == et_def_pb2.NodeType.Value(name)
    assert len(chakra_kinds.COLLECTIVE_NAMES) == len(et_def_pb2.CollectiveCommType.keys())
    for name in et_def_pb2.CollectiveCommType.keys():
        value = et_def_pb2.CollectiveCommType.Value(name)
        assert getattr(chakra_kinds, name) == value
        assert chakra_kinds.collective_name(value) == name


@pytest.mark.parametrize("value", [-1, 10, None, "0"])
def test_a_value_chakra_lacks_is_refused(value):
    with pytest.raises(ValueError):
        chakra_kinds.collective_name(value)


@pytest.mark.parametrize("pair, suffix, loads", [("ddp_gloo", ".json", False), ("ddp_gloo", ".et", True)])
def test_only_an_et_output_loads_protobuf(tmp_path, pair, suffix, loads):
    """A DDP rank (CPU collectives: the plan names their kinds) linked to JSON in a fresh process
    leaves ``google.protobuf`` unloaded; to ``.et`` it loads it."""
    et, kineto = ROOT / "tests" / "fixtures" / pair / "host.0.json.gz", ROOT / "tests" / "fixtures" / pair / "device.0.json.gz"
    script = ("import sys; from linker.pipeline import link_pair; "
              f"link_pair({str(et)!r}, {str(kineto)!r}, {str(tmp_path / ('out' + suffix))!r}); "
              "print('google.protobuf' in sys.modules)")
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    assert shown.stdout.strip() == str(loads)


def test_a_cpu_only_json_link_by_the_command_loads_no_replay_protobuf_or_numpy_ma(tmp_path):
    """The command's own steps around the link (checking ``--waits``, the wait step, which has no
    work on a CPU-only output) load neither the replay, nor the protobuf reader, nor ``numpy.ma``
    (which ``np.unique`` without index outputs pulls in): the command run in a fresh process
    under ``-X importtime``, which names every module imported (the command ends the process
    itself, so nothing after it could print them)."""
    pair = ROOT / "tests" / "fixtures" / "ddp_gloo"
    args = ["--et-file", str(pair / "host.0.json.gz"), "--kineto-file", str(pair / "device.0.json.gz"),
            "-o", str(tmp_path / "out.json"), "--quiet"]
    run = subprocess.run([sys.executable, "-X", "importtime", "-c", "from linker.cli import main; main()", *args],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    imported = {line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert (tmp_path / "out.json").stat().st_size > 0 and "linker.plan.deps" in imported
    assert not {"google.protobuf", "linker.sim.engine", "linker.sim.load", "numpy.ma"} & imported


@pytest.mark.parametrize("suffix, loads", [(".json", False), (".et", True)])
def test_the_wait_step_of_a_json_output_loads_no_protobuf(tmp_path, suffix, loads):
    """A GPU pair linked by the command runs the wait step (the output read back, replayed and
    rewritten with wait nodes): for a JSON output that step reads and rewrites JSON only, so
    ``google.protobuf`` stays unloaded; for a ``.et`` it is loaded (the check can see it)."""
    pair = ROOT / "tests" / "fixtures" / "gpu" / "gpu_v111"
    out = tmp_path / f"out{suffix}"
    args = ["--et-file", str(pair / "et.json.gz"), "--kineto-file", str(pair / "kineto.json.gz"), "-o", str(out)]
    run = subprocess.run([sys.executable, "-X", "importtime", "-c", "from linker.cli import main; main()", *args],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    imported = {line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert "wait node(s) written" in run.stderr and "linker.sim.engine" in imported
    assert ("google.protobuf" in imported) is loads
