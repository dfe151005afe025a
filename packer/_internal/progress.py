"""Progress bars on stderr: files/s and MB/s for long work (build, verify)."""

from __future__ import annotations

import sys
import time
from typing import Any

__all__ = ["BuildProgress", "ListingProgress"]


class ListingProgress:
    """A counter bar (no total) while the source is listed; a no-op when disabled."""

    def __init__(self, *, enabled: bool = True) -> None:
        self._bar: Any = None
        if enabled:
            from tqdm import tqdm  # only when a bar shows: a quiet build never imports it (~15 ms)

            self._bar = tqdm(desc="listing", unit=" files", file=sys.stderr, dynamic_ncols=True, delay=1.0)
        self._shown = 0

    def update(self, seen: int) -> None:
        if self._bar is not None:
            self._bar.update(seen - self._shown)
            self._shown = seen

    def __enter__(self) -> "ListingProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()


class BuildProgress:
    """A tqdm bar counting files, with MB/s in the postfix; a no-op when disabled."""

    def __init__(self, total_files: int, total_bytes: int, *, enabled: bool = True, desc: str = "packing",
                 unit: str = "img") -> None:
        self.enabled = enabled
        self.total_bytes = total_bytes
        self.bytes_done = 0
        self._started = time.monotonic()
        self._last_postfix = 0.0
        self._bar: Any = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total_files, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                             smoothing=0.1)

    def update(self, files: int, nbytes: int) -> None:
        self.bytes_done += nbytes
        if self._bar is None:
            return
        self._bar.update(files)
        now = time.monotonic()
        if now - self._last_postfix > 0.5:
            seconds = max(now - self._started, 1e-9)
            self._bar.set_postfix_str(f"{self.bytes_done / seconds / 1e6:.0f} MB/s", refresh=False)
            self._last_postfix = now

    def __enter__(self) -> "BuildProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()
