"""Small files several processes share (status documents, alert records, the alert inbox): written whole
by an atomic rename, so a reader never sees half a file, and changed under an exclusive lock where two
writers may meet."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path``'s content with ``text``: a temporary file beside it, then a rename (atomic on POSIX)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


def write_json_atomically(path: Path, document) -> None:
    write_atomically(path, json.dumps(document, indent=2, sort_keys=True))


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``<path>.lock`` for the block (one writer of ``path`` at a time, across
    processes and threads: each call opens its own descriptor)."""
    lock = Path(path).with_name(f"{Path(path).name}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
