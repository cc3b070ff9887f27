"""Output where the user means it: a reader sees the old file or the complete new one, never a
torn or empty file, and a path that is not a regular file is written through, never replaced.

Every writer of the package goes through here. Where the output goes (:func:`output_target`):

- ``-`` is standard output, written directly;
- a symlink is followed: the write goes beside the file it points to (the link stays a link);
- a path that is (or resolves to) a FIFO or a character device (``/dev/stdout``, ``/dev/null``, a
  named pipe), or any path under ``/dev`` or ``/proc``, is opened and written directly: replacing it
  would destroy the device node (as root) or the pipe; atomicity is the reader's business there;
- a socket, a block device or a directory is refused;
- anything else (a regular file, or a new name) is written atomically: to a temporary file in the
  target's directory (same file system, so the final ``os.replace`` is atomic), flushed and
  fsynced, then renamed over the target. On any failure (disk full, EFBIG under a file-size limit,
  EACCES, SIGINT/SIGTERM delivered as an exception) the temporary file is removed and the old file
  is left as it was.

The temporary file is named ``.NAME.PID-XXXXXXXX.tmp`` with the writer's process id. A writer
killed by SIGKILL cannot remove its own; the next write to the same target removes every such file
whose writer process no longer exists (:func:`sweep_stale_temps`).

Errors of the environment become :class:`~routepack_opt.core.errors.InputError` (one ``error:`` line,
exit 2 at the CLI). Core layer: imports only the standard library and numpy.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import signal
import stat
import sys
import tempfile
from pathlib import Path

import numpy as np

from routepack_opt.core.errors import InputError

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_open", "save_npz", "check_output_path",
           "output_target", "is_stdout", "sweep_stale_temps", "NAME_MAX"]

# The longest file name (one path component, in bytes) Linux file systems take, and the longest path.
NAME_MAX = 255
PATH_MAX = 4096
# Paths the user names to reach a stream, even where they resolve to a regular file (``/dev/stdout``
# redirected to a file by the shell): written through, never renamed over.
_STREAM_ROOTS = ("/dev/", "/proc/")
_STDOUT_NAMES = ("-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1")


def is_stdout(path) -> bool:
    """``path`` names standard output: ``-``, ``/dev/stdout``, ``/dev/fd/1``, or another stream
    path (a FIFO, a device, a link into /proc) that is the very file standard output writes to."""
    if path is None or str(path) == "":
        return False
    if str(path) in _STDOUT_NAMES:
        return True
    try:
        return output_target(path)[0] == "stdout"
    except InputError:
        return False


def output_target(path) -> tuple[str, Path]:
    """Where a write to ``path`` goes: ``("stdout", path)``, ``("stream", path)`` (opened and
    written directly: a FIFO, a character device, anything under /dev or /proc) or ``("file",
    resolved)`` (written atomically beside ``resolved``, the path with symlinks followed).
    Raises InputError for names a write can never succeed on (empty, too long, a directory, a
    socket, a block device)."""
    text = os.fspath(path)
    if text == "":
        raise InputError("output: the file name is empty; give a file name (or - for standard output)")
    if text in _STDOUT_NAMES:
        return "stdout", Path(text)
    raw = os.fsencode(text)
    if len(raw) >= PATH_MAX:
        raise InputError(f"{text[:60]}…: the output path is {len(raw)} bytes long; at most {PATH_MAX - 1}")
    for part in raw.split(b"/"):
        if len(part) > NAME_MAX:
            shown = os.fsdecode(part)
            raise InputError(f"{shown[:40]}…: a file name of {len(part)} bytes; at most {NAME_MAX} "
                             "per name: choose a shorter output name")
    if text.endswith(os.sep) or text.endswith(os.sep + ".") or text.endswith(os.sep + ".."):
        raise InputError(f"{text}: names a directory; give a file name for the output")
    try:
        st = os.stat(text)  # follows symlinks
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise InputError(f"{text}: directory {os.path.dirname(text) or '.'} does not exist (a part of "
                         "the path is a file)") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(f"{text}: too many levels of symbolic links") from None
        raise InputError(f"{text}: cannot write ({exc.strerror or exc})") from None
    if st is not None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if (not stat.S_ISREG(st.st_mode) or _reaches_stream_root(text)) \
                    and os.path.samestat(st, os.fstat(sys.stdout.fileno())):
                return "stdout", Path(text)  # one stream, one writer: no second file description
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            raise InputError(f"{text}: is a directory; give a file name for the output")
        if stat.S_ISSOCK(mode):
            raise InputError(f"{text}: is a socket; refusing to write a file over it")
        if stat.S_ISBLK(mode):
            raise InputError(f"{text}: is a block device; refusing to write over it")
        if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
            return "stream", Path(text)
    if _reaches_stream_root(text):
        return "stream", Path(text)
    return "file", Path(os.path.realpath(text))


def _reaches_stream_root(text: str) -> bool:
    """The path, or a symlink on its way to a file, lies under /dev or /proc (``/dev/stdout`` →
    ``/proc/self/fd/1`` → the shell's redirect target: written through, never renamed over)."""
    p = os.path.abspath(text)
    for _ in range(40):
        if p.startswith(_STREAM_ROOTS):
            return True
        if not os.path.islink(p):
            return False
        p = os.path.normpath(os.path.join(os.path.dirname(p), os.readlink(p)))
    return False


def _temp_prefix(name: str) -> str:
    """``.NAME.`` — or, for a name too long to carry the suffix, a shortened name with its hash."""
    if len(os.fsencode(name)) > NAME_MAX - 40:
        digest = hashlib.sha1(os.fsencode(name)).hexdigest()[:12]
        name = os.fsdecode(os.fsencode(name)[:150]).rstrip("\ufffd") + "~" + digest
    return f".{name}."


_TEMP_RE = re.compile(r"(\d+)-[A-Za-z0-9_]+\.tmp")


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not ours to judge
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists, another user's
    return True


def sweep_stale_temps(target: Path) -> list[str]:
    """Remove the temporary files of writes to ``target`` whose writer process is gone (killed by
    SIGKILL mid-write); returns their names. Files of a live writer are left alone."""
    directory = target.parent if str(target.parent) else Path(".")
    prefix = _temp_prefix(target.name)
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(prefix):
            continue
        m = _TEMP_RE.fullmatch(name[len(prefix):])
        if m is None or int(m.group(1)) == os.getpid() or _pid_alive(int(m.group(1))):
            continue
        with contextlib.suppress(OSError):
            os.unlink(directory / name)
            removed.append(name)
    return removed


@contextlib.contextmanager
def atomic_open(path, mode: str = "wb"):
    """``with atomic_open(path) as fh: ...`` writes ``path`` where the user means it (see the
    module doc): atomically for a file, directly for standard output, a FIFO or a device."""
    kind, target = output_target(path)
    if kind != "file":
        with _stream_open(kind, target, mode) as fh:
            yield fh
        return
    directory = target.parent
    sweep_stale_temps(target)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f"{_temp_prefix(target.name)}{os.getpid()}-", suffix=".tmp",
                                   dir=directory)
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
        os.replace(tmp, target)
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


@contextlib.contextmanager
def _stream_open(kind: str, target: Path, mode: str):
    """Standard output, a FIFO or a device, written through (no temporary file, no rename)."""
    old_xfsz = _ignore_sigxfsz()
    try:
        if kind == "stdout":
            sys.stdout.flush()
            raw = getattr(sys.stdout, "buffer", None)
            if raw is None and "b" in mode:
                raise InputError("standard output takes text only here (no binary buffer); give a file name")
            fh = raw if "b" in mode else sys.stdout
            yield fh
            fh.flush()
        else:
            with open(target, mode) as fh:
                yield fh
                fh.flush()
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            raise
        name = "standard output" if kind == "stdout" else str(target)
        raise InputError(f"{name}: cannot write ({exc.strerror or exc})") from None
    finally:
        _restore_sigxfsz(old_xfsz)


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
    """Refuse, before any work starts, an output no write can succeed on (:func:`output_target`:
    empty, a name over 255 bytes, a directory or a name ending in ``/``, a socket, a block device),
    one that is an input (through links and other spellings), in a missing directory or in one we
    cannot write. Standard output, FIFOs and character devices pass (they are written through).
    Returns ``Path(out)`` (None for None)."""
    if out is None:
        return None
    kind, target = output_target(out)
    if kind == "stdout":
        return Path(out)
    for inp in inputs:
        if inp is None:
            continue
        if _same_file(target, Path(inp)):
            raise InputError(f"{out}: the output would overwrite the input {inp}; choose another name")
    if kind == "stream":
        return Path(out)
    parent = target.parent
    if not parent.is_dir():
        raise InputError(f"{out}: directory {Path(out).parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{out}: directory {parent} is not writable")
    return Path(out)


def _same_file(a: Path, b: Path) -> bool:
    try:
        if str(b) == "-" or is_stdout(a):
            return False
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
        return a.resolve() == b.resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
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
