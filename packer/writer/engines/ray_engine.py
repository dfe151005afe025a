"""The Ray engine: planned shards packed as Ray tasks on an existing cluster or a local one.

Nothing about the output depends on the engine: each task runs the same
``pack_planned_shard`` as the local engine, against the plan saved in the output folder (which
every node must see, e.g. on a shared filesystem), so the result is byte-identical. Ray retries
a task whose worker died; a retried task redoes its shard from scratch (shard files are
content-addressed and records are written atomically, so a half-finished attempt leaves nothing
that the retry could mistake for done work).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ...errors import MissingDependencyError
from ..plan import BuildPlan

__all__ = ["run_with_ray", "require_ray", "map_with_ray"]

_plans: dict[tuple[str, int], BuildPlan] = {}


def _pack_remote(plan_path: str, fingerprint: int, root: str, out: str, shard: int,
                 fail_on_reject: bool) -> tuple[int, int]:
    """Body of one Ray task: returns (files handled, payload bytes packed)."""
    from ..pack import pack_planned_shard
    from ...errors import BuildError
    from ..plan import load_plan

    # One plan load per Ray worker process and plan: a later build into the same folder (same
    # path, new plan) must never be packed with a cached older plan.
    plan = _plans.get((plan_path, fingerprint))
    if plan is None:
        plan = load_plan(Path(plan_path), Path(root))
        if plan.fingerprint != fingerprint:
            raise BuildError("the build plan changed while its tasks were running (another build into "
                             "this folder?)", path=plan_path)
        _plans.clear()
        _plans[(plan_path, fingerprint)] = plan
    counts = [0, 0]

    def tally(files: int, nbytes: int) -> None:
        counts[0] += files
        counts[1] += nbytes

    pack_planned_shard(plan, Path(out), shard, progress=tally, fail_on_reject=fail_on_reject)
    return counts[0], counts[1]


def require_ray() -> Any:
    """The ``ray`` module.

    Raises:
        MissingDependencyError: Ray is not installed (checked before a build plans anything).
    """
    try:
        import ray
    except ImportError:
        raise MissingDependencyError("--engine ray needs Ray, which is not installed: "
                                     "pip install 'packer-shards[ray]' (or build with --engine local)") from None
    return ray


def run_with_ray(plan: BuildPlan, out: Path, shard_ids: list[int], *, address: str | None,
                 progress: Callable[[int, int], None], fail_on_reject: bool, num_cpus: int | None = None,
                 max_retries: int = 3) -> None:
    """Run one Ray task per planned shard and wait for all, feeding one progress bar."""
    ray = require_ray()
    from ..staging import PLAN_NAME, STAGING_DIR

    started_here = not ray.is_initialized()
    if started_here:
        init_args: dict[str, Any] = {"address": address, "include_dashboard": False, "log_to_driver": False,
                                     "configure_logging": False}
        if address is None and num_cpus is not None:
            init_args["num_cpus"] = num_cpus
        ray.init(**init_args)
    try:
        task = ray.remote(max_retries=max_retries, retry_exceptions=False)(_pack_remote)
        plan_path = str((out / STAGING_DIR / PLAN_NAME).resolve())
        pending = [task.remote(plan_path, plan.fingerprint, str(Path(plan.listing.root).resolve()),
                               str(out.resolve()), shard, fail_on_reject) for shard in shard_ids]
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=0.5)
            for ref in done:
                files, nbytes = ray.get(ref)  # re-raises the task's error (as a RayTaskError)
                progress(files, nbytes)
    except Exception as exc:
        cause = getattr(exc, "cause", None)
        if cause is not None and isinstance(cause, Exception):
            raise cause from None  # surface the PackerError a task raised, not Ray's wrapper
        raise
    finally:
        if started_here:
            ray.shutdown()


def _map_remote(function: Callable[..., Any], state: Any, argument: Any) -> tuple[Any, int, int]:
    """Body of one Ray task of ``map_with_ray``: the result, and the progress it made."""
    counts = [0, 0]

    def tally(files: int, nbytes: int) -> None:
        counts[0] += files
        counts[1] += nbytes

    result = function(state, argument, tally)
    return result, counts[0], counts[1]


def map_with_ray(function: Callable[[Any, Any, Callable[[int, int], None]], Any], arguments: list[Any], *,
                 state: Any, address: str | None, progress: Callable[[int, int], None],
                 on_result: Callable[[Any], None] = lambda result: None, max_retries: int = 3) -> None:
    """``function(state, argument, progress)`` for every argument as Ray tasks (``packer.pack``'s
    chunks); ``state`` is put in the object store once (Ray pickles it with cloudpickle, so a
    lambda or a function defined in ``__main__`` travels by value). A task whose worker died is
    retried: ``function`` must redo its work from scratch, as a build's shard task does."""
    ray = require_ray()
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        task = ray.remote(max_retries=max_retries, retry_exceptions=False)(_map_remote)
        state_ref = ray.put(state)
        pending = [task.remote(function, state_ref, argument) for argument in arguments]
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=0.5)
            for ref in done:
                result, files, nbytes = ray.get(ref)  # re-raises the task's error (as a RayTaskError)
                progress(files, nbytes)
                on_result(result)
    except Exception as exc:
        cause = getattr(exc, "cause", None)
        if cause is not None and isinstance(cause, Exception):
            raise cause from None  # the PackerError a task raised, not Ray's wrapper
        raise
    finally:
        if started_here:
            ray.shutdown()
