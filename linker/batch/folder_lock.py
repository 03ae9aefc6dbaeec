"""One writer per output folder: the lock a batch (or ``astra-setup``) holds on the folder it writes.

Two batches into one folder would each rewrite the other's outputs (a rank's start delay node
written twice): the second must stop before it writes anything. The contract:

- the lock is the file ``LOCK_NAME`` in the folder, holding the owner's pid, host and command
  (JSON), and an exclusive ``flock`` on it for as long as the owner runs. Taking it is atomic: the
  OS grants the ``flock`` to one process, and the file is checked to be the one at the path (a
  lock released and unlinked meanwhile is tried again);
- a folder whose lock another live process holds raises ``FolderBusyError``, one line naming the
  folder and the owner; nothing is written;
- the lock is released and its file removed on every way out of the ``with`` block (a normal end,
  an error, Ctrl-C, SIGTERM; a signal that comes while the lock is being taken is held back until
  it is, so that it too finds the block's cleanup). A process killed outright (SIGKILL) leaves the
  file, but the OS drops its ``flock``: the next run takes it over, with a warning naming the dead
  owner when it was on this host. A file naming another host whose ``flock`` is free is not taken (a file system that does
  not carry locks between hosts cannot tell a live owner there from a dead one): the error says to
  remove the file if that owner is gone.

Cost: a few system calls. Dask runs take it in the client, which is the process writing the
folder's shared files.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Callable, Iterator

from linker.batch.errors import BatchSetupError

LOCK_NAME = ".et-link.lock"


class FolderBusyError(BatchSetupError):
    """Another process writes the folder; one line naming the folder and its owner."""


def _owner_text(info: dict) -> str:
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')} ({info.get('command', 'et-link')})"


def _read_owner(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 4096)
    try:
        info = json.loads(text) if text else {}
    except ValueError:
        info = {}
    return info if isinstance(info, dict) else {}


@contextlib.contextmanager
def owned_folder(folder: str | os.PathLike, command: str,
                 warn: Callable[[str], None] | None = None) -> Iterator[Path]:
    """Hold ``folder`` (created if missing) for this process while the block runs; see the module.
    ``command``: what the owner is, named in another process's error; ``warn``: where the note of
    a taken-over stale lock goes (stderr by default). Raises ``FolderBusyError`` when another
    process holds it, ``BatchSetupError`` when the folder or its lock cannot be made."""
    folder = Path(folder).absolute()
    path = folder / LOCK_NAME
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BatchSetupError(f"cannot create the output directory {folder}: {err}") from None
    fd = None
    me = os.getpid()
    try:
        with _signals_held():  # Ctrl-C between making the file and holding it would leave it behind
            fd = _take(path, folder)
            previous = _read_owner(fd)
            host = socket.gethostname()
            if previous.get("host") not in (None, host):
                os.close(fd)  # the file stays: it is that owner's
                fd = None
                raise FolderBusyError(f"{folder}: the lock {LOCK_NAME} names {_owner_text(previous)}, another "
                                      f"host; remove {path} if that run is gone")
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"pid": me, "host": host, "command": command}).encode())
        if previous:
            note = (f"et-link: {folder}: taking over the lock of {_owner_text(previous)}, which ended "
                    f"without releasing it")
            (warn or (lambda text: print(text, file=sys.stderr)))(note)
        yield folder
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                if os.getpid() == me and _same_file(fd, path):  # a forked child leaving the block: not its lock
                    path.unlink()
            os.close(fd)  # drops the flock


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back while the block runs (in the main thread; elsewhere Python
    delivers no signals), then deliver any that came, so that they land where the caller's
    ``finally`` can clean up."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {number: signal.signal(number, lambda number, frame: arrived.append(number)) for number in held}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number in dict.fromkeys(arrived):
            signal.raise_signal(number)


def _same_file(fd: int, path: Path) -> bool:
    try:
        held, named = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def _take(path: Path, folder: Path) -> int:
    """An fd of ``path`` holding its exclusive flock (the file made if missing). Raises
    ``FolderBusyError`` when a live process holds it."""
    for _ in range(100):  # each retry: the file was removed by its owner between our open and flock
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            if not os.access(folder, os.W_OK | os.X_OK) or err.errno == errno.EROFS:
                raise BatchSetupError(f"{folder}: the output directory is not writable ({err.strerror})") from None
            raise BatchSetupError(f"{folder}: cannot make the lock file {LOCK_NAME}: {err.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_owner(fd)
            os.close(fd)
            raise FolderBusyError(f"{folder}: another et-link run writes this folder ({_owner_text(owner)}); "
                                  f"wait for it to end or choose another --output-dir") from None
        if _same_file(fd, path):
            return fd
        os.close(fd)
    raise FolderBusyError(f"{folder}: the lock {LOCK_NAME} keeps changing hands")
