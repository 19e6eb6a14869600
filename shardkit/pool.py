"""Run shard tasks on a pool of worker processes (joblib/loky), with a progress bar in samples.

One task = one shard, so decoded arrays never cross a pipe. ``workers == 1`` runs in
this process (simplest to debug, same bytes). A worker that dies (killed, out of
memory) surfaces as a :class:`WorkerError`, never a hang.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator, Sequence

from .errors import ShardkitError, WorkerError
from .plan import ShardTask
from .worker import ShardResult, WorkerContext, convert_shard

log = logging.getLogger(__name__)


def _progress(total: int, quiet: bool):  # type: ignore[no-untyped-def]
    from tqdm import tqdm

    disable = quiet or not sys.stderr.isatty()
    return tqdm(total=total, unit="sample", desc="convert", disable=disable, dynamic_ncols=True, leave=False)


def run_tasks(
    tasks: Sequence[ShardTask],
    ctx: WorkerContext,
    *,
    workers: int,
    quiet: bool = False,
    on_result: Callable[[ShardResult], None] | None = None,
    isolate: bool = False,
) -> list[ShardResult]:
    """Convert every task; ``on_result`` sees each as it finishes; the list comes back in task order."""
    total = sum(len(t.samples) for t in tasks)
    results: list[ShardResult] = []
    with _progress(total, quiet) as bar:
        for result in _iterate(tasks, ctx, workers, isolate):
            bar.update(len(result.samples) + len(result.skipped))
            if on_result is not None:
                on_result(result)
            results.append(result)
    order = {(t.split, t.index): i for i, t in enumerate(tasks)}
    results.sort(key=lambda r: order[(r.split, r.index)])
    return results


def _iterate(tasks: Sequence[ShardTask], ctx: WorkerContext, workers: int, isolate: bool) -> Iterator[ShardResult]:
    """``isolate``: run even a single worker in a subprocess (for writers whose imports clash with the caller's)."""
    n_jobs = max(1, min(workers, len(tasks)))
    if n_jobs == 1 and not isolate:
        for task in tasks:
            yield convert_shard(task, ctx)
        return
    from joblib import Parallel, delayed
    from joblib.externals.loky.process_executor import TerminatedWorkerError

    try:
        if n_jobs == 1:  # joblib runs n_jobs=1 in this process even with loky: submit to its loky executor
            from joblib.executor import get_memmapping_executor

            executor = get_memmapping_executor(1)
            for task in tasks:
                yield executor.submit(convert_shard, task, ctx).result()
            return
        parallel = Parallel(n_jobs=n_jobs, backend="loky", return_as="generator_unordered", pre_dispatch="2*n_jobs")
        yield from parallel(delayed(convert_shard)(t, ctx) for t in tasks)
    except TerminatedWorkerError as exc:
        raise WorkerError(
            f"a worker process died ({str(exc).splitlines()[0][:200]})",
            fix="it was probably killed or ran out of memory; re-run with fewer --workers or a smaller --shard-size",
        ) from None
    except ShardkitError:
        raise
