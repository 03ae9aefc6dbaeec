"""Link every rank of a job: ``et-link batch``.

Steps, each one a plain function over plain data, each in its own module:

| step | module | what |
|---|---|---|
| 1. pair | ``pairing`` (``linker.read.rank_names``) | ET and Kineto files by rank: ``distributedInfo.rank`` from the Kineto header, else the file name; every problem reported before any work |
| 2. plan | ``folder_lock``, ``tasks``, ``memory``, ``job.plan_batch`` | the output folder held for this run alone (a lock file with ``flock``: a second batch or ``astra-setup`` stops in one line, a dead owner's lock is taken over); one ``RankTask`` per rank with its outputs (``rank<N>_plus.json`` or ``rank.<N>.et``, ``rank<N>.report.json``) and its estimated peak memory; complete ranks set aside (``link_rank.completed_result``) |
| 3. run | ``link_rank``, ``local``, ``remote`` | one fresh process per rank: forked locally within ``--workers`` and the memory budget, or a subprocess on a Dask worker; a failing rank only records its error |
| 4. check | ``collectives`` | the job's process groups and the cross-rank comparison of every group's collectives |
| 5. set up the simulator | ``rank_start``, ``rank_start_et``, ``astra_setup``, ``astra_collectives``, ``job.simulator_setup`` | each rank's start offset written into its output as a delay node; for ``--format et`` the outputs read back as replay graphs, then the ASTRA-sim configuration and ``run`` script (a large job's rewrites and reads in forked children: ``Schedule.each_output``) |
| 6. summarise | ``summary`` | per-rank table, job totals, ranks that stand out; ``summary.json`` |

After the batch, ``astra_run`` (``et-link astra-run``) runs the setup of step 5 with the ASTRA-sim
binary and sets its answer beside the measured times of ``summary.json``.
``job.run_batch`` ties them together; ``progress`` draws the ranks' progress on stderr; ``errors``
holds the setup errors raised before any work.
This package re-exports the names callers use (``from linker.batch import run_batch``).
"""

from linker.model.exit_status import EXIT_RANKS_FAILED
from linker.batch.collectives import format_ranks
from linker.read.rank_names import NAME_RANK_PATTERNS, TRACE_SUFFIXES, RankOfFile, rank_from_name
from linker.batch.errors import BatchSetupError, PairingError
from linker.batch.job import BatchConfig, BatchPlan, default_workers, parse_bytes, plan_batch, run_batch
from linker.batch.link_rank import SIDECAR_VERSION, completed_result, run_rank_task
from linker.batch.local import pick_next_task, run_local
from linker.batch.memory import (
    MEMORY_BUDGET_SHARE,
    PEAK_BASE_BYTES,
    PEAK_BYTES_PER_INPUT_BYTE,
    TYPICAL_GZIP_RATIO,
    available_memory_bytes,
    estimate_peak_bytes,
    uncompressed_size,
)
from linker.batch.pairing import (
    HEAD_BYTES,
    DistributedInfo,
    Pairing,
    RankPair,
    expand_glob,
    kineto_rank,
    pair_rank_files,
    read_distributed_info,
)
from linker.batch.remote import child_main, run_dask, run_rank_subprocess
from linker.batch.summary import BatchSummary, BatchTotals, Outlier, find_outliers, format_table, summarize_totals, write_summary
from linker.batch.tasks import RankResult, RankTask, failed_result, make_task, output_name

__all__ = [
    "EXIT_RANKS_FAILED", "HEAD_BYTES", "MEMORY_BUDGET_SHARE", "NAME_RANK_PATTERNS", "PEAK_BASE_BYTES",
    "PEAK_BYTES_PER_INPUT_BYTE", "SIDECAR_VERSION", "TRACE_SUFFIXES", "TYPICAL_GZIP_RATIO",
    "BatchConfig", "BatchPlan", "BatchSetupError", "BatchSummary", "BatchTotals", "DistributedInfo",
    "Outlier", "Pairing", "PairingError", "RankOfFile", "RankPair", "RankResult", "RankTask",
    "available_memory_bytes", "child_main", "completed_result", "default_workers", "estimate_peak_bytes",
    "expand_glob", "failed_result", "find_outliers", "format_ranks", "format_table", "kineto_rank",
    "make_task", "output_name", "pair_rank_files", "parse_bytes", "pick_next_task", "plan_batch",
    "rank_from_name", "read_distributed_info", "run_batch", "run_dask", "run_local", "run_rank_subprocess",
    "run_rank_task", "summarize_totals", "uncompressed_size", "write_summary",
]
