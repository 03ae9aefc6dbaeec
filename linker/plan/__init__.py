"""The plan wing: what a simulator needs beyond the times (``docs/durations.md``).

Computed once per ET+ and read by both writers, so JSON and ``.et`` agree.

| module | what |
|---|---|
| ``busy`` | busy time per CPU op (exclusive - blocked, its time after its first child in its later pieces, + folded host gap) and the cross-thread ``fork`` / ``join`` structure |
| ``later_pieces`` | an op's exclusive time after its first child, as pieces (``Pieces``): nodes of their own, run where the thread ran them |
| ``dependency_plan`` | the plan as a value: ``DependencyPlan``, node numbering (``NO_NODE``), the ``CAUSES``, the ``WriteSummary`` counts |
| ``deps`` | builds the ``DependencyPlan``: ctrl and data dependencies, each with its cause, the collective order, the topological write order |
| ``waits`` | the wait edges of blocking runtime calls (``sync``, ``event_wait``) added to a plan |
| ``clocks`` | the CPU/GPU clock skew a trace shows, and the blocking copies it lets through |
| ``cpu_comm`` | CPU collectives (gloo, MPI, UCC) as communication nodes, held for their measured duration |
| ``rank_start`` | a rank's measured start offset as a leading delay node (``docs/rank-start.md``) |
| ``comm`` | communication attributes of NCCL/RCCL kernels: type, bytes, process group (PyTorch's number + 1), peer |
| ``json_fields`` | the ET+ JSON's simulation fields (``blocked_dur``, ``host_gap_dur``, ``sim_dur``, ``data_deps``, ``data_dep_causes``, ``comm_*``) from the plan |
"""
