"""Run shard tasks on a pool of worker processes, with a progress bar in samples.

One task = one shard, so decoded arrays never cross a pipe. Two backends run the same
tasks through joblib: ``local`` (loky processes on this machine; ``workers == 1`` runs in
this process, simplest to debug, same bytes) and ``dask`` (the workers of a Dask
cluster, or a local one started here). A worker that dies surfaces as a
:class:`WorkerError`, never a hang; on Dask its shard is first re-run on another worker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import ShardkitError, WorkerError
from ..files.splitfiles import TMP_MARK
from ..formats.registry import get
from ..support.extras import install_hint
from ..support.progress import SampleCounter, progress_bar
from .plan import ShardTask
from .worker import ShardResult, WorkerContext, convert_shard, convert_shard_in_worker

log = logging.getLogger(__name__)

#: Seconds to wait for a Dask scheduler to answer, and for its first worker to join.
CONNECT_TIMEOUT = 20.0
#: Workers of the local Dask cluster started when no ``--scheduler`` is given and ``workers`` is 0.
LOCAL_CLUSTER_WORKERS = 2


def run_tasks(
    tasks: Sequence[ShardTask],
    ctx: WorkerContext,
    *,
    workers: int,
    quiet: bool = False,
    on_result: Callable[[ShardResult], None] | None = None,
    isolate: bool = False,
    backend: str = "local",
    scheduler: str | None = None,
) -> list[ShardResult]:
    """Convert every task; ``on_result`` sees each as it finishes; the list comes back in task order.

    ``backend="dask"`` runs the tasks on the Dask cluster at ``scheduler`` (e.g.
    ``tcp://host:8786``), or on a local cluster of ``workers`` processes when it is ``None``.
    No tasks (a re-run that reuses every shard) starts no pool and returns an empty list.
    """
    if backend not in ("local", "dask"):
        raise WorkerError(f"unknown backend {backend!r}", fix="use backend 'local' or 'dask'")
    if not tasks:
        return []
    total = sum(len(t.samples) for t in tasks)
    results: list[ShardResult] = []
    # Largest shards first, so the run does not end with one worker busy on a big shard and the
    # rest idle (shard sizes vary with content-defined cuts). Output order does not depend on it.
    tasks = sorted(tasks, key=lambda t: -len(t.samples))
    slot_of = {(t.split, t.index): i for i, t in enumerate(tasks)}
    with progress_bar(total, quiet) as bar, _counter(len(tasks), bar, backend) as counter:
        if backend == "dask":
            stream = _iterate_dask(tasks, ctx, workers, scheduler)
        else:
            stream = _iterate(tasks, ctx, workers, isolate, counter)
        for result in stream:
            done = result.num_samples + len(result.skipped)
            if counter is not None:
                counter.settle(slot_of[(result.split, result.index)], done)
            else:
                bar.update(done)
            log.debug("shard %s/%05d done: %d samples", result.split, result.index, result.num_samples)
            if on_result is not None:
                on_result(result)
            results.append(result)
    results.sort(key=lambda r: slot_of[(r.split, r.index)])
    return results


def _first_line(exc: BaseException, limit: int) -> str:
    """The first line of ``exc``'s message, at most ``limit`` characters; its type's name when it has no text
    (``str(TimeoutError())`` is empty: indexing its lines would raise over the error being reported)."""
    lines = str(exc).strip().splitlines()
    return lines[0][:limit] if lines else type(exc).__name__


@contextlib.contextmanager
def _counter(n: int, bar: Any, backend: str) -> Iterator[SampleCounter | None]:
    """The workers' shared per-sample counter, when a bar is shown and the workers are local processes."""
    if backend != "local" or bar.disable:
        yield None
        return
    try:
        counter = SampleCounter(n, bar)
    except OSError as exc:  # no shared memory / temp folder: the bar moves per shard instead
        log.debug("per-sample progress unavailable (%s)", exc)
        yield None
        return
    with counter:
        yield counter


@contextlib.contextmanager
def _children_ignore_sigint() -> Iterator[None]:
    """Worker processes started inside inherit SIGINT ignored (an ignored signal survives fork and exec).

    Ctrl-C in a terminal reaches the whole process group: the workers would print KeyboardInterrupt
    tracebacks (even mid-import) over the one line this process prints. Only this process handles it:
    joblib then kills the workers and the pipeline removes their temporary files. A Ctrl-C pressed in
    the ~0.1 s the workers take to start is lost (blocking it instead does not help: another thread
    of this process would take it and drop it).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


#: A ``-W`` option for the processes loky starts: its resource tracker, when this process is killed, removes
#: the pool's semaphores and memory-mapping folders (right) and warns about each "leaked" one on stderr, lines
#: after the shell's "Killed" (noise: nothing is left behind).
_TRACKER_WARNING = "ignore:resource_tracker:UserWarning"


def _quiet_resource_tracker() -> None:
    """Have the processes loky starts from now on (its resource tracker) ignore its "leaked semlock" warnings.

    loky starts them with this interpreter's ``-W`` options (``sys.warnoptions``); this process's own warning
    filters do not change.
    """
    if _TRACKER_WARNING not in sys.warnoptions:
        sys.warnoptions.append(_TRACKER_WARNING)


def _iterate(
    tasks: Sequence[ShardTask], ctx: WorkerContext, workers: int, isolate: bool, counter: SampleCounter | None,
) -> Iterator[ShardResult]:
    """Local processes. ``isolate``: run even one worker in a subprocess (for writers whose imports clash).

    Each task counts its samples in its slot of ``counter`` (shared with the worker processes).
    """
    if not tasks:  # (run_tasks already returns early; a pool started for nothing would index tasks[0])
        return
    n_jobs = max(1, min(workers, len(tasks)))
    if n_jobs == 1 and not isolate:
        for slot, task in enumerate(tasks):
            yield convert_shard(task, ctx, None if counter is None else counter.tick(slot))
        return
    ref = None if counter is None else counter.ref
    _quiet_resource_tracker()
    from joblib import Parallel, delayed
    from joblib.externals.loky.process_executor import TerminatedWorkerError

    parent = os.getpid()  # the workers die with this process (Linux), so a SIGKILL here leaves no writers
    try:
        if n_jobs == 1:  # joblib runs n_jobs=1 in this process even with loky: submit to its loky executor
            from joblib.executor import get_memmapping_executor

            with _children_ignore_sigint():
                executor = get_memmapping_executor(1, max_nbytes=None)
                first = executor.submit(convert_shard_in_worker, tasks[0], ctx, parent, ref, 0)
            yield first.result()
            for slot, task in enumerate(tasks[1:], 1):
                yield executor.submit(convert_shard_in_worker, task, ctx, parent, ref, slot).result()
            return
        parallel = Parallel(n_jobs=n_jobs, backend="loky", return_as="generator_unordered", max_nbytes=None,
                            pre_dispatch="2*n_jobs")
        with _children_ignore_sigint():  # joblib starts the workers and dispatches the first tasks here
            results = parallel(delayed(convert_shard_in_worker)(t, ctx, parent, ref, slot)
                               for slot, t in enumerate(tasks))
        yield from results
    except TerminatedWorkerError as exc:
        raise WorkerError(
            f"a worker process died ({_first_line(exc, 200)})",
            fix="it was probably killed or ran out of memory; re-run with fewer --workers or a smaller "
            "--shard-size",
        ) from None


# --- Dask ---------------------------------------------------------------------------------------


def _iterate_dask(
    tasks: Sequence[ShardTask], ctx: WorkerContext, workers: int, scheduler: str | None
) -> Iterator[ShardResult]:
    """The same ``convert_shard`` tasks on Dask workers, through joblib's Dask backend, as they finish.

    Workers write their shards straight into the output folder, so input and output must be on a
    filesystem every worker mounts at the same path (checked before the first task). A worker lost
    mid-task is handled by the scheduler: the task runs again on another worker (up to the scheduler's
    ``distributed.scheduler.allowed-failures``), writing fresh temporary files (their names carry the
    writing process's id); the parent renames only the files named in the one result it receives, and
    deletes the lost attempts' temporary files once every shard is in.
    """
    if not tasks:
        return
    try:
        import distributed
        from joblib import Parallel, delayed, parallel_config
    except ImportError:
        raise WorkerError("the dask backend needs dask.distributed, which is not installed",
                          fix=install_hint("dask")) from None
    # Workers have their own working folder: give them absolute paths (the same on a shared filesystem).
    tasks = [dataclasses.replace(t, directory=Path(t.directory).absolute()) for t in tasks]
    with _DaskClient(distributed, scheduler, workers, len(tasks)) as client:
        _check_workers(distributed, client, {t.directory for t in tasks}, ctx.root)
        try:
            with parallel_config(backend="dask", client=client, wait_for_workers_timeout=CONNECT_TIMEOUT):
                parallel = Parallel(n_jobs=-1, return_as="generator_unordered", batch_size=1,
                                    pre_dispatch="2*n_jobs")
                results = parallel(delayed(_convert_on_dask)(t, ctx) for t in tasks)
                try:
                    for result in results:  # noqa: UP028 - not `yield from`: it would close `results` unguarded
                        yield result
                finally:
                    with warnings.catch_warnings():  # on an early stop joblib warns of results left unused
                        warnings.simplefilter("ignore", UserWarning)
                        results.close()
        except distributed.KilledWorker as exc:
            raise WorkerError(
                f"a shard task was lost with its Dask worker too often ({_first_line(exc, 200)})",
                fix="it probably exhausts a worker's memory: use a smaller --shard-size or give workers "
                "more memory",
            ) from None
        except TimeoutError as exc:  # joblib: no worker joined within wait_for_workers_timeout
            raise WorkerError(f"the Dask cluster has no workers ({_first_line(exc, 120)})",
                              fix="start workers with: dask worker SCHEDULER_ADDRESS") from None
    removed = _remove_lost_attempts(tasks, ctx)
    if removed:
        log.warning("dask: removed %d temporary files of attempts lost with their worker", removed)


def _convert_on_dask(task: ShardTask, ctx: WorkerContext) -> ShardResult:
    """``convert_shard`` on a Dask worker; an unexpected error comes back as a one-line WorkerError.

    A ShardkitError travels as it is. Anything else is turned into text here, because an exception
    that cannot be pickled back to the client would leave the run waiting for ever.
    """
    try:
        return convert_shard(task, ctx)
    except ShardkitError:
        raise
    except Exception as exc:
        raise WorkerError(f"shard {task.split}/{task.stem} failed on a Dask worker: {type(exc).__name__}: "
                          f"{_first_line(exc, 200)}", fix="see the worker's log for the traceback") from None


class _DaskClient:
    """A ``distributed.Client`` to ``scheduler``, or to a loopback-only local cluster run here."""

    def __init__(self, distributed: Any, scheduler: str | None, workers: int, n_tasks: int) -> None:
        self.distributed = distributed
        self.scheduler = scheduler
        self.n_workers = max(1, min(workers or LOCAL_CLUSTER_WORKERS, n_tasks))
        self.cluster: Any = None
        self.client: Any = None

    def __enter__(self) -> Any:
        d = self.distributed
        if self.scheduler is None:
            self.cluster = d.LocalCluster(n_workers=self.n_workers, processes=True, threads_per_worker=1,
                                          host="127.0.0.1", dashboard_address=":0")
            try:
                self.client = d.Client(self.cluster, set_as_default=False)
            except BaseException:
                self.cluster.close()
                raise
            log.info("dask: started a local cluster of %d worker processes at %s", self.n_workers,
                     self.cluster.scheduler_address)
            return self.client
        try:
            self.client = d.Client(self.scheduler, timeout=CONNECT_TIMEOUT, set_as_default=False)
        except (OSError, ValueError, TimeoutError) as exc:
            raise WorkerError(
                f"cannot reach the Dask scheduler at {self.scheduler} ({_first_line(exc, 160)})",
                fix="check the address and port (e.g. --scheduler tcp://host:8786) and that `dask scheduler` "
                "runs there",
            ) from None
        log.info("dask: connected to the scheduler at %s", self.scheduler)
        return self.client

    def __exit__(self, *exc: object) -> None:
        if self.client is not None:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def _probe(paths: list[str]) -> tuple[bool, str]:
    """Runs on each Dask worker: does it see these paths, and which shardkit does it have?"""
    from .._version import __version__

    return all(Path(p).exists() for p in paths), __version__


def _check_workers(distributed: Any, client: Any, directories: set[Path], root: Path) -> None:
    """Fail early unless every worker sees the input and this run's output folders and runs this shardkit."""
    from .._version import __version__

    try:
        client.wait_for_workers(1, timeout=CONNECT_TIMEOUT)
    except (TimeoutError, OSError):
        raise WorkerError(f"the Dask cluster has no workers after {CONNECT_TIMEOUT:.0f} s",
                          fix="start workers with: dask worker SCHEDULER_ADDRESS") from None
    token = uuid.uuid4().hex
    probes = [d / f".probe{TMP_MARK}{token}" for d in sorted(directories)]
    try:
        for p in probes:  # a file only this run could have made: proves the same filesystem, not a look-alike
            p.touch()
        answers = client.run(_probe, [str(root), *map(str, probes)])
    except (ImportError, AttributeError) as exc:
        raise WorkerError(f"the Dask workers cannot run shardkit ({exc})",
                          fix="install the same shardkit version in the workers' environment") from None
    finally:
        for p in probes:
            p.unlink(missing_ok=True)
    blind = sorted(addr for addr, (sees, _) in answers.items() if not sees)
    if blind:
        raise WorkerError(
            f"{len(blind)} of {len(answers)} Dask workers (e.g. {blind[0]}) cannot see {root} or the output "
            "folder",
            fix="put input and output on a filesystem every worker mounts at the same path (NFS, Lustre…)",
        )
    other = sorted({version for _, version in answers.values()} - {__version__})
    if other:
        raise WorkerError(f"Dask workers run shardkit {other[0]}, this client {__version__}",
                          fix="install the same shardkit version on every worker (it decides the bytes)")
    threads = sum(client.ncores().values())
    log.info("dask: %d workers, %d threads, all see the input and output folders", len(answers), threads)


def _remove_lost_attempts(tasks: Sequence[ShardTask], ctx: WorkerContext) -> int:
    """Delete temporary shard files of attempts whose worker was lost (their shards were re-run)."""
    fmt = get(ctx.format)
    removed = 0
    for task in tasks:
        for name in fmt.published_names(task.stem, ctx.spec):
            for p in task.directory.glob(fmt.tmp_glob(name)):
                p.unlink(missing_ok=True)
                removed += 1
    return removed
