"""Run the tasks on a Dask cluster: each task runs ``python`` in a fresh subprocess on a worker
(``run_rank_subprocess``). Step 3 of ``et-link batch`` with ``--scheduler``. Cost: the ranks' links
plus one interpreter start per rank.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path

from linker.batch.progress import BatchProgress
from linker.batch.errors import BatchSetupError
from linker.batch.link_rank import run_rank_task
from linker.batch.local import exit_description
from linker.batch.tasks import RankResult, RankTask, failed_result, report_done

_CHILD_CODE = "from linker.batch.remote import child_main; child_main()"


def child_main() -> None:
    """Entry of ``run_rank_subprocess``'s child: a pickled RankTask on stdin, the pickled
    RankResult on stdout (anything else the linker prints goes to stderr)."""
    task = pickle.load(sys.stdin.buffer)
    result_stream = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    pickle.dump(run_rank_task(task), result_stream)
    result_stream.close()


def run_rank_subprocess(task: RankTask) -> RankResult:
    """Run ``run_rank_task`` in a fresh Python process (Dask task body). Never raises.

    The fresh process gives the rank its own peak-memory figure and keeps a crash (or the OOM
    killer) from taking the Dask worker down. The child finds this package via PYTHONPATH.
    """
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    started = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD_CODE], input=pickle.dumps(task),
                              capture_output=True, env=env, check=False)
    except OSError as err:
        return failed_result(task, f"cannot start a Python process on {socket.gethostname()}: {err}")
    if proc.returncode == 0:
        with contextlib.suppress(Exception):
            result = pickle.loads(proc.stdout)
            if isinstance(result, RankResult):
                return result
    stderr = proc.stderr.decode("utf-8", errors="replace").strip().splitlines()
    detail = f": {stderr[-1]}" if stderr else ""
    return failed_result(task, exit_description(proc.returncode) + detail, time.perf_counter() - started)


def import_distributed():
    try:
        import distributed
    except ImportError:
        raise BatchSetupError("--scheduler needs Dask: install it with  pip install 'et-link[dask]'") from None
    return distributed


def run_dask(tasks: list[RankTask], scheduler: str, progress: BatchProgress | None = None,
             connect_timeout: float = 30.0) -> list[RankResult]:
    """Run the tasks on an existing Dask cluster (``scheduler`` address, e.g. tcp://host:8786).

    Each task is ``run_rank_subprocess`` on a worker (one fresh process per rank there too), so
    workers must see the same paths (shared storage) and have et-link installed. Placement and
    concurrency are Dask's (one task per worker thread). A lost task is that rank's failure.
    """
    distributed = import_distributed()
    try:
        client = distributed.Client(scheduler, timeout=connect_timeout, set_as_default=False)
    except (OSError, TimeoutError) as err:
        raise BatchSetupError(f"cannot connect to the Dask scheduler {scheduler}: {err}") from None
    results: list[RankResult] = []
    futures: dict = {}
    try:
        token = f"{os.getpid()}-{time.time_ns()}"
        for task in sorted(tasks, key=lambda t: (-t.estimated_peak_bytes, t.rank)):
            future = client.submit(run_rank_subprocess, task, key=f"et-link-rank{task.rank}-{token}",
                                   pure=False, retries=0)
            futures[future] = task
            if progress:
                progress.started(task.rank)
        pending = distributed.as_completed(list(futures), loop=client.loop)
        for future in pending:
            task = futures[future]
            try:
                result = future.result()
            except Exception as err:
                result = failed_result(task, f"Dask task failed: {type(err).__name__}: {err}")
            results.append(result)
            report_done(progress, task, result)
    except BaseException:
        client.cancel(list(futures))
        raise
    finally:
        client.close()
    return results
