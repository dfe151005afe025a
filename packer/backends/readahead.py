"""The read-ahead thread: prepares item ``k+1`` (reads, copies, decodes) while the caller uses item ``k``.

Used by the GPU batch loaders (``packer.gpu``). The thread knows nothing about CUDA: what the
thread must set up before it produces anything (the loader's CUDA device, then a stream on it)
is the ``setup`` context manager, entered on the thread itself. That matters because a new
Python thread starts on CUDA device 0 whatever ``torch.cuda.set_device`` the main thread made:
state that is per thread has to be set inside the thread.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, ContextManager, Iterator

__all__ = ["ReadAhead"]


class ReadAhead:
    """Runs ``produce(k)`` for ``k`` in ``range(count)`` on a background thread, ``depth`` results ahead.

    Args:
        produce: makes item ``k``.
        count: how many items.
        depth: items prepared ahead of the consumer (at least 1).
        setup: returns a context manager entered on the thread before the first ``produce``
            and exited after the last (e.g. a CUDA device and stream); None for none.

    Errors raised by ``setup`` or ``produce`` are re-raised in the consumer, at the item where
    they happened. ``close()`` stops the thread and waits for it: whatever ``produce`` was
    doing (a read into a staging buffer) has finished when ``close()`` returns.
    """

    def __init__(self, produce: Callable[[int], Any], count: int, depth: int = 1,
                 setup: Callable[[], ContextManager[Any] | None] | None = None) -> None:
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(produce, count, setup), daemon=True,
                                        name="packer-read-ahead")
        self._thread.start()

    def _put(self, item: tuple[str, Any]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, produce: Callable[[int], Any], count: int,
             setup: Callable[[], ContextManager[Any] | None] | None) -> None:
        try:
            context = setup() if setup is not None else None
            if context is not None:
                context.__enter__()
            try:
                for k in range(count):
                    if self._stop.is_set() or not self._put(("item", produce(k))):
                        return
            finally:
                if context is not None:
                    context.__exit__(None, None, None)
            self._put(("done", None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            self._put(("error", exc))

    def __iter__(self) -> Iterator[Any]:
        while True:
            kind, value = self._queue.get()
            if kind == "done":
                return
            if kind == "error":
                raise value
            yield value

    def close(self) -> None:
        """Stop producing and wait until the thread has ended (its last ``produce`` included)."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=0.05)
