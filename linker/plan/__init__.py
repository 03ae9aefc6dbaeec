"""The plan wing: what a simulator needs beyond the times (``docs/durations.md``).

Computed once per ET+ and read by both writers, so JSON and ``.et`` agree.

| module | what |
|---|---|
| ``busy`` | busy time per CPU op (exclusive - blocked + folded host gap) and the cross-thread ``fork`` / ``join`` structure |
| ``deps`` | ``DependencyPlan``: ctrl and data dependencies, each with its cause, waits of blocking runtime calls, the topological write order |
| ``comm`` | communication attributes of NCCL/RCCL kernels: type, bytes, process group (PyTorch's number + 1), peer |
| ``json_fields`` | the ET+ JSON's simulation fields (``blocked_dur``, ``host_gap_dur``, ``sim_dur``, ``data_deps``, ``data_dep_causes``, ``comm_*``) from the plan |
"""
