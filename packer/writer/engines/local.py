"""The local engine: planned shards packed by a pool of worker processes on this machine."""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_module
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable

from ..._internal.machine import available_cpus
from ..plan import BuildPlan, load_plan

__all__ = ["run_local", "map_local", "check_spawnable"]

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
    calls = [(_pack_in_worker, (shard, fail_on_reject)) if segments[shard] == 1
             else (_segment_in_worker, (shard, k, segments[shard], fail_on_reject))
             for shard in todo for k in range(segments[shard])]
    finished: dict[int, list[Any]] = {}  # shard -> its packed segments, until all are in

    def done(result: Any) -> None:
        if isinstance(result, int):
            return
        parts = finished.setdefault(result.shard, [])
        parts.append(result)
        if len(parts) == segments[result.shard]:
            assemble_shard(plan, out, result.shard, parts)

    def failed() -> None:
        # Segments of shards that will not be assembled, whoever wrote them (finished,
        # finished in the same wait, or still running at shutdown): this run owns these shards.
        temp_dir = out / STAGING_DIR / TEMP_DIR
        for shard, count in segments.items():
            if count > 1:
                for path in temp_dir.glob(f"shard-{shard:05d}.seg-*.partial"):
                    path.unlink(missing_ok=True)

    _run_pool(context, min(workers, tasks), _init_worker,
              (plan_path, str(plan.listing.root), str(out), progress_queue, os.getpid()), calls,
              progress_queue=progress_queue, progress=progress, on_result=done, on_failure=failed)


def _run_pool(context: Any, workers: int, initializer: Callable[..., None], initargs: tuple[Any, ...],
              calls: list[tuple[Callable[..., Any], tuple[Any, ...]]], *, progress_queue: Any,
              progress: Callable[[int, int], None], on_result: Callable[[Any], None],
              on_failure: Callable[[], None] = lambda: None) -> None:
    """Run ``calls`` (function, arguments) over a pool of ``workers`` forked processes, each set up
    by ``initializer(*initargs)``; ``on_result`` gets each result in this process, in the order
    they finish; the workers' ``(files, bytes)`` progress reaches ``progress`` through
    ``progress_queue``. A worker's error (or Ctrl-C) stops the pool, runs ``on_failure`` and is
    raised here."""
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=initializer,
                             initargs=initargs) as pool:
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
        # (only the main thread may set handlers; None: a handler not set from Python, kept;
        # SIG_IGN: SIGINT ignored, as a background job of a non-interactive shell inherits it
        # (`packer build ... &` in a script): a Ctrl-C meant for the script is not this build's)
        record = (threading.current_thread() is threading.main_thread()
                  and signal.getsignal(signal.SIGINT) not in (None, signal.SIG_IGN))
        if record:
            previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
        if blocked:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for function, arguments in calls:
                pending.add(pool.submit(function, *arguments))
        finally:
            if blocked:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            if record:
                signal.signal(signal.SIGINT, previous)
        try:
            if interrupted:
                raise KeyboardInterrupt
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
                _drain(progress_queue, progress)
                for future in done:
                    on_result(future.result())  # re-raises a worker's error here
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                # Workers ignore SIGINT: stop them now rather than wait for their current task
                # (their temp files are removed by on_failure or by the next --resume). The pool is then
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
            on_failure()
            raise
        finally:
            _drain(progress_queue, progress)


# --- any work over the same pool: packer.pack's chunks --------------------------------------------------

def _init_map_worker(state: Any, progress_queue: Any, parent_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _exit_with_parent(parent_pid)
    # Forked: ``state`` (a user's function and inputs) is inherited, never pickled.
    _state["map"] = state
    _state["queue"] = progress_queue


def _map_in_worker(function: Callable[..., Any], argument: Any) -> Any:
    progress_queue = _state["queue"]
    return function(_state["map"], argument, lambda files, nbytes: progress_queue.put((files, nbytes)))


def map_local(function: Callable[[Any, Any, Callable[[int, int], None]], Any], arguments: list[Any], *, state: Any,
              workers: int | None, progress: Callable[[int, int], None],
              on_result: Callable[[Any], None] = lambda result: None) -> None:
    """``function(state, argument, progress)`` for every argument, over the build's process pool
    (in this process when one worker is asked). ``function`` and the arguments cross the process
    boundary (module-level, small); ``state`` is inherited by the forked workers, so it may hold
    anything (a lambda, a function defined in ``__main__``, a Dataset object).

    Raises:
        OptionError: where workers are spawned rather than forked (not POSIX) and ``state``
            cannot be sent to them.
    """
    workers = available_cpus() if workers is None else max(1, workers)
    if workers == 1 or len(arguments) <= 1:
        for argument in arguments:
            on_result(function(state, argument, progress))
        return
    if os.name != "posix":  # spawned workers import what they run: refuse what they could not
        check_spawnable(state)
    context = multiprocessing.get_context("spawn" if os.name != "posix" else "fork")
    progress_queue = context.Queue()
    _run_pool(context, min(workers, len(arguments)), _init_map_worker, (state, progress_queue, os.getpid()),
              [(_map_in_worker, (function, argument)) for argument in arguments],
              progress_queue=progress_queue, progress=progress, on_result=on_result)


def check_spawnable(state: Any) -> None:
    """Refuse a function that a spawned worker could not import (a lambda, a nested function, one
    defined in ``__main__`` of an interactive session).

    Raises:
        OptionError: naming the function and what to do.
    """
    from ...errors import OptionError

    function = getattr(state, "fn", None)
    if function is None:
        return
    name = getattr(function, "__qualname__", repr(function))
    module = getattr(function, "__module__", "")
    if "<lambda>" in name or "<locals>" in name or (module == "__main__" and not hasattr(
            sys.modules.get("__main__"), "__file__")):
        raise OptionError(f"fn {name!r} cannot reach spawned worker processes (it is a lambda, a nested "
                          f"function or defined interactively): define it at the top level of a module, or "
                          f"use workers=1")


def _drain(progress_queue: Any, progress: Callable[[int, int], None]) -> None:
    while True:
        try:
            files, nbytes = progress_queue.get_nowait()
        except queue_module.Empty:
            return
        progress(files, nbytes)
