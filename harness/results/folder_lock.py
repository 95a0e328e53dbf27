"""One writer per results folder: an exclusive lock held while a run (or a sweep) writes it.

Two runs writing one folder mix their records, and `--overwrite` of a live run's folder once unlinked its
requests.jsonl under it (the live run went on writing to a file no one could open, and both exited 0). The lock
is flock(2) on `<folder>/.bench.lock`: the kernel lets go of it when its holder exits, killed or not, so a stale
lock file never blocks anyone. The file names its holder (pid, command, start time) for the refusal's message.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

LOCK_NAME = ".bench.lock"


class FolderBusy(Exception):
    """The folder is being written by another live run; the message names the holder and the fix."""


class FolderLock:
    """Held from take() to release(); release() removes the file."""

    def __init__(self, folder: Path, fd: int) -> None:
        self.folder, self._fd = folder, fd

    @classmethod
    def take(cls, folder: str | Path) -> FolderLock:
        folder = Path(folder)
        path = folder / LOCK_NAME
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "another run"
                os.close(fd)
                raise FolderBusy(
                    f"--output: {folder} is being written by a run in progress ({holder}); wait for it to end "
                    f"or choose another folder (--overwrite never replaces a live run's results)"
                ) from None
            # the holder before us may have removed the file between our open and our lock: lock the one there now
            try:
                if os.fstat(fd).st_ino == os.stat(path).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        holder = f"pid {os.getpid()}, {' '.join(Path(a).name if i == 0 else a for i, a in enumerate(sys.argv))[:200]}"
        holder += f", since {time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.encode() + b"\n", 0)
        except OSError:  # a full disk: the lock holds all the same, only its message is shorter
            pass
        return cls(folder, fd)

    @staticmethod
    def check_free(folder: str | Path) -> None:
        """Raises FolderBusy when a live run holds `folder` (before a sweep's --overwrite deletes it)."""
        if (Path(folder) / LOCK_NAME).exists():
            FolderLock.take(folder).release()

    def release(self) -> None:
        if self._fd < 0:
            return
        (self.folder / LOCK_NAME).unlink(missing_ok=True)  # before unlocking: a newcomer locks a fresh file
        os.close(self._fd)
        self._fd = -1
