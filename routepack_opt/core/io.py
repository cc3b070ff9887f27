"""Atomic output: a reader sees the old file or the complete new one, never a torn or empty file.

Every writer of the package goes through here. A write goes to a temporary file in the target's
directory (same file system, so the final ``os.replace`` is atomic), is flushed and fsynced, then
renamed over the target; on any failure (disk full, EFBIG under a file-size limit, EACCES, a kill
signal delivered as an exception) the temporary file is removed and the old file is left as it was.
Errors of the environment become :class:`~routepack_opt.core.errors.InputError` (one ``error:`` line,
exit 2 at the CLI). Core layer: imports only the standard library and numpy.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from pathlib import Path

import numpy as np

from routepack_opt.core.errors import InputError

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_open", "save_npz", "check_output_path"]


@contextlib.contextmanager
def atomic_open(path, mode: str = "wb"):
    """``with atomic_open(path) as fh: ...`` writes ``path`` atomically (see the module doc)."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise InputError(f"{path}: cannot write ({exc.strerror or exc})") from None
    # SIGXFSZ kills the process by default when a write crosses RLIMIT_FSIZE; ignoring it turns the
    # write into an EFBIG error we can clean up after (only possible in the main thread).
    old_xfsz = _ignore_sigxfsz()
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        with contextlib.suppress(OSError):
            os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)
        raise InputError(f"{path}: cannot write ({exc.strerror or exc}); the previous file, if any, "
                         "is unchanged") from None
    except BaseException:
        _remove(tmp)
        raise
    finally:
        _restore_sigxfsz(old_xfsz)
    _fsync_dir(directory)


def atomic_write_bytes(path, data: bytes) -> None:
    with atomic_open(path, "wb") as fh:
        fh.write(data)


def atomic_write_text(path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def save_npz(path, compressed: bool = True, **arrays) -> None:
    """``np.savez(_compressed)`` of ``arrays`` to ``path``, atomically (no ``.npz`` appended)."""
    with atomic_open(path, "wb") as fh:
        (np.savez_compressed if compressed else np.savez)(fh, **arrays)


def check_output_path(out, *inputs) -> Path | None:
    """Refuse, before any work starts, an output that is an input, a directory, in a missing
    directory or in one we cannot write. Returns ``Path(out)`` (None for None)."""
    if out is None:
        return None
    path = Path(out)
    if str(out).endswith(os.sep) or path.is_dir():
        raise InputError(f"{out}: is a directory; give a file name for the output")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"{out}: directory {parent} does not exist")
    for inp in inputs:
        if inp is None:
            continue
        if _same_file(path, Path(inp)):
            raise InputError(f"{out}: the output would overwrite the input {inp}; choose another name")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{out}: directory {parent} is not writable")
    if path.exists() and not os.access(path, os.W_OK) and not os.access(parent, os.W_OK):
        raise InputError(f"{out}: not writable")
    return path


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
        return a.resolve() == b.resolve()
    except OSError:
        return False


def _remove(tmp: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(tmp)


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable (best effort; not every file system allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _ignore_sigxfsz():
    sig = getattr(signal, "SIGXFSZ", None)
    if sig is None:
        return None
    try:
        return signal.signal(sig, signal.SIG_IGN)
    except ValueError:  # not the main thread
        return None


def _restore_sigxfsz(old) -> None:
    if old is not None:
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGXFSZ, old)
