"""et-link from Python, notebook style: link a pair, write its ET+, replay it, look at the tables.

    python scripts/library_example.py [ET KINETO]   # default: the GPU fixture pair in tests/fixtures

Each ``# %%`` cell can be pasted into a notebook. The last cells need pandas (``pip install
pandas``); without it they say so and the script still ends successfully. The tests run it.
"""

# %% Link one pair in memory: the result's report is a typed object.
import sys
import tempfile
from pathlib import Path

import linker

here = Path(__file__).resolve().parents[1]
et_file, kineto_file = (sys.argv[1:3] if len(sys.argv) > 2 else
                        (here / "tests/fixtures/gpu/gpu_v111/et.json.gz", here / "tests/fixtures/gpu/gpu_v111/kineto.json.gz"))
result = linker.link_traces(et_file, kineto_file)
report = result.report
print(f"linked {report.linked_ops} of {report.et_ops} ET ops by {report.method}; "
      f"{report.gpu_events_linked} of {report.gpu_events_in_trace} GPU events attached")

# %% Write the ET+ as Chakra protobuf (and the report as JSON), then replay it.
out = Path(tempfile.mkdtemp(prefix="et-link-example-"))
written = linker.write_et_plus(result, out / "pair.et", out / "pair.report.json")
simulation = linker.simulate(written.output)
sim = simulation.report
print(f"measured {sim.measured_us:.0f} us, simulated {sim.simulated_us:.0f} us, ratio {sim.ratio}")
for op in sim.critical_path[:3]:
    print(f"  on the critical path: {op.name} ({op.kind}, {op.us:.0f} us)")

# %% Tables (pandas): ops, GPU events, the critical path.
try:
    import pandas  # noqa: F401  (only to know whether the tables can be made)
except ImportError:
    print("pandas is not installed: no tables (pip install pandas)")
else:
    ops = linker.ops_table(result)
    busiest, waited = ops.nlargest(1, "busy_us").iloc[0], ops.nlargest(1, "blocked_us").iloc[0]
    print(f"ops table: {len(ops)} rows; most busy: {busiest['name']} ({busiest['busy_us']:.0f} us); "
          f"most blocked: {waited['name']} ({waited['blocked_us']:.0f} of {waited['exclusive_us']:.0f} us)")
    gpu = linker.gpu_events_table(result)
    print("GPU events by reason:", gpu["reason"].value_counts().to_dict())
    path = simulation.critical_path_table()
    print("critical path time by kind (us):", path.groupby("kind")["us"].sum().round(1).to_dict())
    nodes = simulation.nodes_table()  # measured and simulated starts from one origin: the step's start
    print(f"replayed nodes: median drift {nodes['drift_us'].median():.1f} us")

# %% A saved ET+ (JSON or .et), from the file alone: where the time went, by op name. Plain rows
# (as_rows=True) need no pandas.
saved = linker.load(written.output)
top = saved.op_names_table(as_rows=True)[0]
print(f"most busy op: {top['name'][:60]} ({top['kind']}, {top['ops']} ops, {top['busy_us']:.0f} us busy, "
      f"{top['blocked_us']:.0f} us blocked)")
