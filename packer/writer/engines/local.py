"""The local engine: planned shards packed by a pool of worker processes on this machine."""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_module
import signal
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable

from ...machine import available_cpus
from ..plan import BuildPlan, load_plan

__all__ = ["run_local"]

_state: dict[str, Any] = {}


def _exit_with_parent(parent_pid: int) -> None:
    """Exit as soon as the build process is gone (killed with SIGKILL, say).

    A forked worker inherits the build's ``flock`` on the output folder (the lock belongs to the
    open file, which fork shares) and, orphaned, would wait for work forever, keeping the folder
    locked so that ``--resume`` is refused until someone kills it by hand.
    """
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, name="packer-exit-with-parent", daemon=True).start()


def _init_worker(plan_path: str, root: str, out: str, progress_queue: Any, parent_pid: int) -> None:
    # Ctrl-C reaches the whole process group: the build process handles it (and stops the
    # workers); a worker printing its own KeyboardInterrupt traceback would only add noise.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # forked with SIGINT blocked (see run_local): now ignored
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _exit_with_parent(parent_pid)
    # Each worker maps the saved plan itself: nothing large crosses the process boundary.
    _state["plan"] = load_plan(Path(plan_path), Path(root))
    _state["out"] = Path(out)
    _state["queue"] = progress_queue


def _pack_in_worker(shard: int, fail_on_reject: bool) -> int:
    from ..pack import pack_planned_shard

    progress_queue = _state["queue"]
    pack_planned_shard(_state["plan"], _state["out"], shard, fail_on_reject=fail_on_reject,
                       progress=lambda files, nbytes: progress_queue.put((files, nbytes)))
    return shard


def _segment_in_worker(shard: int, segment: int, segments: int, fail_on_reject: bool) -> Any:
    from ..pack import pack_segment

    progress_queue = _state["queue"]
    return pack_segment(_state["plan"], _state["out"], shard, segment, segments, fail_on_reject=fail_on_reject,
                        progress=lambda files, nbytes: progress_queue.put((files, nbytes)))


def run_local(plan: BuildPlan, out: Path, shard_ids: list[int], *, workers: int | None,
              progress: Callable[[int, int], None], fail_on_reject: bool) -> None:
    """Pack ``shard_ids`` over a process pool (in this process when one worker is asked).

    With at least as many shards as workers, each task is one whole shard. With fewer (a small
    dataset, or a last part), shards are split into segments packed in parallel and joined in
    order with ``copy_file_range``: the bytes are the same as a single writer's, so the output
    does not depend on the number of workers.
    """
    from ..pack import assemble_shard, pack_planned_shard, segment_count, shard_is_done
    from ..staging import PLAN_NAME, STAGING_DIR, TEMP_DIR

    workers = available_cpus() if workers is None else max(1, workers)
    if workers == 1:
        for shard in shard_ids:
            pack_planned_shard(plan, out, shard, progress=progress, fail_on_reject=fail_on_reject)
        return
    todo = []
    for shard in shard_ids:
        if shard_is_done(plan, out, shard):
            progress(len(plan.shard_members(shard)), 0)
        else:
            todo.append(shard)
    if not todo:
        return
    wanted = -(-2 * workers // len(todo)) if len(todo) < workers else 1  # ~2 tasks per worker
    segments = {shard: segment_count(plan, shard, wanted) for shard in todo}
    context = multiprocessing.get_context("spawn" if os.name != "posix" else "fork")
    progress_queue = context.Queue()
    plan_path = str(out / STAGING_DIR / PLAN_NAME)
    tasks = sum(segments.values())
    with ProcessPoolExecutor(max_workers=min(workers, tasks), mp_context=context,
                             initializer=_init_worker,
                             initargs=(plan_path, str(plan.listing.root), str(out), progress_queue, os.getpid())) as pool:
        pending: set[Future[Any]] = set()
        # The first submit forks the workers: with SIGINT blocked meanwhile, a Ctrl-C cannot reach
        # a worker before its initializer ignores it (it would print its own traceback). The
        # mask is per thread, so another thread of this process (the pool's manager, a progress
        # bar) can still take the signal, and Python then raises KeyboardInterrupt in the main
        # thread wherever it is, e.g. inside an at-fork hook that prints and swallows it (the build
        # then ran to the end). So the signal is also only recorded while forking, and raised
        # inside the try below, where the workers are stopped.
        blocked = hasattr(signal, "pthread_sigmask")
        interrupted: list[int] = []
        # (only the main thread may set handlers; None: a handler not set from Python, kept)
        record = threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is not None
        if record:
            previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
        if blocked:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for shard in todo:
                if segments[shard] == 1:
                    pending.add(pool.submit(_pack_in_worker, shard, fail_on_reject))
                else:
                    pending.update(pool.submit(_segment_in_worker, shard, k, segments[shard], fail_on_reject)
                                   for k in range(segments[shard]))
        finally:
            if blocked:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            if record:
                signal.signal(signal.SIGINT, previous)
        finished: dict[int, list[Any]] = {}  # shard -> its packed segments, until all are in
        try:
            if interrupted:
                raise KeyboardInterrupt
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
                _drain(progress_queue, progress)
                for future in done:
                    result = future.result()  # re-raises a worker's error here
                    if isinstance(result, int):
                        continue
                    parts = finished.setdefault(result.shard, [])
                    parts.append(result)
                    if len(parts) == segments[result.shard]:
                        assemble_shard(plan, out, result.shard, parts)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                # Workers ignore SIGINT: stop them now rather than wait for their current shard
                # (their temp files are removed below or by the next --resume). The pool is then
                # broken and its manager thread fails every pending future itself; cancelling
                # them first makes that thread (Python 3.11's terminate_broken) die with
                # InvalidStateError and print a traceback above the one-line message.
                for process in list(getattr(pool, "_processes", {}).values()):  # no public API in 3.11
                    process.terminate()
                pool.shutdown(wait=True)
            else:
                for future in pending:
                    future.cancel()
                pool.shutdown(wait=True, cancel_futures=True)
            # Segments of shards that will not be assembled, whoever wrote them (finished,
            # finished in the same wait, or still running at shutdown): this run owns these shards.
            temp_dir = out / STAGING_DIR / TEMP_DIR
            for shard, count in segments.items():
                if count > 1:
                    for path in temp_dir.glob(f"shard-{shard:05d}.seg-*.partial"):
                        path.unlink(missing_ok=True)
            raise
        finally:
            _drain(progress_queue, progress)


def _drain(progress_queue: Any, progress: Callable[[int, int], None]) -> None:
    while True:
        try:
            files, nbytes = progress_queue.get_nowait()
        except queue_module.Empty:
            return
        progress(files, nbytes)
