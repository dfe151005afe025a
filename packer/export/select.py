"""Which samples an export takes: ``--classes``, ``--samples START:STOP`` and ``--keys FILE``, all together.

The keys file is a user-named file: it is read bounded (``MAX_KEYS_FILE_BYTES``), regular files
only (a FIFO or ``/dev/zero`` is refused at once, never read), as UTF-8, one key per line (a
trailing ``\\r`` of CRLF files is dropped; blank lines are skipped). A listed key that the dataset
does not hold is an error naming it, never silently skipped.
"""

from __future__ import annotations

import os
import stat
from typing import Any

import numpy as np

from ..errors import OptionError
from .._internal.files import open_nonblocking, read_fd_capped
from ..location import parse_location

__all__ = ["select_samples", "read_keys_file", "MAX_KEYS_FILE_BYTES"]

#: The largest ``--keys`` file read (about 20 million keys of 50 bytes).
MAX_KEYS_FILE_BYTES = 1 << 30


def read_keys_file(path: str | os.PathLike[str], *, cap: int = MAX_KEYS_FILE_BYTES) -> list[str]:
    """The keys listed in ``path`` (module docstring), in file order.

    Raises:
        OptionError: the file is missing, not a regular file, over ``cap`` bytes, or not UTF-8, or
            ``path`` is a URL.
    """
    path = parse_location(path, what="--keys").local_path("the keys file is read from a local file")
    try:
        fd, info = open_nonblocking(path)
    except OSError as exc:
        raise OptionError(f"--keys: cannot open {os.fspath(path)}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(info.st_mode):
            raise OptionError(f"--keys: {os.fspath(path)} is not a regular file (a folder, FIFO or device); "
                              f"give a file listing one key per line")
        if info.st_size > cap:
            raise OptionError(f"--keys: {os.fspath(path)} is {info.st_size} bytes, over the {cap} bytes read")
        try:
            data = read_fd_capped(fd, cap, info.st_size)
        except OSError as exc:
            raise OptionError(f"--keys: cannot read {os.fspath(path)}: {exc.strerror or exc}") from None
        if data is None:
            raise OptionError(f"--keys: {os.fspath(path)} grew past the {cap} bytes read")
    finally:
        os.close(fd)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise OptionError(f"--keys: {os.fspath(path)} is not UTF-8 ({exc.reason} at byte {exc.start}); keys are "
                          f"listed as the dataset spells them (`packer inspect --sample` shows a key)") from None
    keys = []
    for line in text.split("\n"):
        line = line[:-1] if line.endswith("\r") else line
        if line.strip():
            keys.append(line)
    return keys


def select_samples(dataset: Any, *, classes: list[str] | None = None, samples: str | None = None,
                   keys: str | os.PathLike[str] | None = None) -> np.ndarray:
    """Sample indices passing every filter, in dataset order.

    Raises:
        OptionError: an unknown class, a malformed range, an unreadable keys file, or a listed
            key the dataset does not hold.
    """
    count = len(dataset)
    keep = np.ones(count, dtype=bool)
    if samples:
        try:
            start_text, _, stop_text = samples.partition(":")
            start = int(start_text) if start_text else None
            stop = int(stop_text) if stop_text else None
        except ValueError:
            raise OptionError(f"--samples must be START:STOP (e.g. 0:1000), got {samples!r}") from None
        ranged = np.zeros(count, dtype=bool)
        ranged[slice(start, stop)] = True
        keep &= ranged
    if classes:
        names = dataset.classes
        wanted = []
        for name in classes:
            if name in names:
                wanted.append(names.index(name))
            else:
                try:
                    wanted.append(int(name))
                except ValueError:
                    raise OptionError(f"--classes: {name!r} is not a class of this dataset "
                                      f"({', '.join(names[:10])}{', ...' if len(names) > 10 else ''})") from None
        keep &= np.isin(dataset.labels, np.asarray(wanted, dtype=np.int64))
    if keys is not None:
        wanted_keys = set(read_keys_file(keys))
        present = np.fromiter((dataset.key(i) in wanted_keys for i in range(count)), dtype=bool, count=count)
        missing = wanted_keys.difference(dataset.key(i) for i in np.flatnonzero(present).tolist())
        if missing:
            first = sorted(missing)[:5]
            raise OptionError(f"--keys: {len(missing)} of the {len(wanted_keys)} keys listed in {os.fspath(keys)} are "
                              f"not in this dataset (first: {', '.join(repr(k) for k in first)}); keys are "
                              f"spelled as the dataset stores them")
        keep &= present
    return np.flatnonzero(keep)
