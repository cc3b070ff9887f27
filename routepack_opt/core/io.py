"""Output where the user means it: a reader sees the old file or the complete new one, never a
torn or empty file, and a write never goes through a link into anything else.

Every writer of the package goes through here. Where the output goes (:func:`output_target`):

- ``-`` (and ``/dev/stdout``, ``/dev/fd/1``, ``/proc/self/fd/1``, by name) is standard output,
  written through the process's own stream; the path is never opened;
- a new name, or an existing regular file, is written atomically: to a temporary file in the same
  directory (same file system, so the final ``os.replace`` is atomic), created with
  ``O_CREAT | O_EXCL | O_NOFOLLOW`` (never an existing file, never through a link), flushed and
  fsynced, then renamed over the final name (``rename`` replaces the name itself, never what a
  link there points to). On any failure (disk full, EFBIG under a file-size limit, EACCES,
  SIGINT/SIGTERM delivered as an exception) the temporary file is removed and the old file is
  left as it was;
- anything else already at the final name is refused before any work, never opened: a symbolic
  link (its target could be an input: ``OUT_DIR/report.html`` linked to a window of RUN_DIR), a
  FIFO (opening it would block until a reader comes), a character or block device, a socket, a
  directory. The final path is looked at with ``lstat``, so a link is seen as a link; the
  directories above it may be links;
- an output that is one of the command's inputs (the same path after ``realpath``, or the same
  ``st_dev``/``st_ino``: a hard link, another spelling) is refused (:func:`check_output_path`).

``steps.jsonl`` is appended, not replaced (:func:`append_bytes`): opened with ``O_APPEND |
O_NOFOLLOW | O_NONBLOCK`` and used only when it is a regular file, so a link or a FIFO there is
refused the same way and never waited on.

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
import secrets
import signal
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from routepack_opt.core.errors import InputError

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_open", "save_npz", "check_output_path",
           "output_target", "is_stdout", "sweep_stale_temps", "append_bytes", "truncate_file", "NAME_MAX"]

# The longest file name (one path component, in bytes) Linux file systems take, and the longest path.
NAME_MAX = 255
PATH_MAX = 4096
# Names of standard output: written through the process's own stream, the path never opened.
_STDOUT_NAMES = ("-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1")
# What stands at a final path and is never written through or replaced (lstat's mode → why).
# (the messages say "stdout", not "standard output": the CLI reads that phrase as its own stream failing)
_REFUSED_KINDS = (
    (stat.S_ISLNK, "is a symbolic link; outputs are never written through a link (its target could be "
                   "an input): remove the link or name the file itself"),
    (stat.S_ISFIFO, "is a named pipe (FIFO); outputs are written to regular files only (opening a FIFO "
                    "would wait for a reader): give a file name, or - for stdout"),
    (stat.S_ISCHR, "is a character device; outputs are written to regular files only: give a file name, "
                   "or - for stdout"),
    (stat.S_ISBLK, "is a block device; refusing to write over it"),
    (stat.S_ISSOCK, "is a socket; refusing to write a file over it"),
    (stat.S_ISDIR, "is a directory; give a file name for the output"),
)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def is_stdout(path) -> bool:
    """``path`` names standard output: ``-``, ``/dev/stdout``, ``/dev/fd/1`` or ``/proc/self/fd/1``."""
    return path is not None and os.fspath(path) in _STDOUT_NAMES


def _refuse_kind(text: str, mode: int) -> None:
    for test, why in _REFUSED_KINDS:
        if test(mode):
            raise InputError(f"{text}: {why}")
    if not stat.S_ISREG(mode):
        raise InputError(f"{text}: not a regular file; outputs replace regular files only")


def output_target(path) -> tuple[str, Path]:
    """Where a write to ``path`` goes: ``("stdout", path)`` or ``("file", path)`` (written
    atomically at ``path`` itself, never at what a link there points to). Raises InputError for
    names a write can never succeed on (empty, too long, ending in ``/``) and for anything but a
    regular file already at the final name (a symlink, a FIFO, a device, a socket, a directory):
    looked at with ``lstat``, never opened."""
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
    if text.endswith(os.sep) or text.endswith(os.sep + ".") or text.endswith(os.sep + "..") \
            or text in (".", ".."):
        raise InputError(f"{text}: names a directory; give a file name for the output")
    try:
        st = os.lstat(text)  # the final name itself: a link is seen as a link
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
        _refuse_kind(text, st.st_mode)
    return "file", Path(text)


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


def _make_temp(directory: Path, target: Path, path) -> tuple[int, str]:
    """A new temporary file beside ``target``: ``O_CREAT | O_EXCL | O_NOFOLLOW`` (never an
    existing name, never through a link), mode 0666 less the umask as any new file."""
    prefix = f"{_temp_prefix(target.name)}{os.getpid()}-"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    for _ in range(100):
        tmp = os.path.join(directory, f"{prefix}{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
        except OSError as exc:
            raise InputError(f"{path}: cannot write ({exc.strerror or exc})") from None
    raise InputError(f"{path}: cannot create a temporary file in {directory} (every name taken)")


@contextlib.contextmanager
def atomic_open(path, mode: str = "wb", inputs: Iterable = ()):
    """``with atomic_open(path) as fh: ...`` writes ``path`` where the user means it (see the
    module doc): atomically for a file, directly for standard output; refused (InputError, before
    anything is written) for a link, a FIFO, a device, a socket or a directory at ``path``, and for
    any of ``inputs``."""
    if inputs:
        check_output_path(path, *inputs)
    kind, target = output_target(path)
    if kind == "stdout":
        with _stdout_open(mode) as fh:
            yield fh
        return
    directory = target.parent if str(target.parent) else Path(".")
    sweep_stale_temps(target)
    fd, tmp = _make_temp(directory, target, path)
    # SIGXFSZ kills the process by default when a write crosses RLIMIT_FSIZE; ignoring it turns the
    # write into an EFBIG error we can clean up after (only possible in the main thread).
    old_xfsz = _ignore_sigxfsz()
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        output_target(target)  # what appeared at the name meanwhile (a link, a FIFO) is refused too
        os.replace(tmp, target)  # renames over the name itself: a link there is replaced, not followed
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
def _stdout_open(mode: str):
    """Standard output, written through (no temporary file, no rename)."""
    old_xfsz = _ignore_sigxfsz()
    try:
        sys.stdout.flush()
        raw = getattr(sys.stdout, "buffer", None)
        if raw is None and "b" in mode:
            raise InputError("standard output takes text only here (no binary buffer); give a file name")
        fh = raw if "b" in mode else sys.stdout
        yield fh
        fh.flush()
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            raise
        raise InputError(f"standard output: cannot write ({exc.strerror or exc})") from None
    finally:
        _restore_sigxfsz(old_xfsz)


def atomic_write_bytes(path, data: bytes, inputs: Iterable = ()) -> None:
    with atomic_open(path, "wb", inputs) as fh:
        fh.write(data)


def atomic_write_text(path, text: str, inputs: Iterable = ()) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), inputs)


def save_npz(path, compressed: bool = True, **arrays) -> None:
    """``np.savez(_compressed)`` of ``arrays`` to ``path``, atomically (no ``.npz`` appended)."""
    with atomic_open(path, "wb") as fh:
        (np.savez_compressed if compressed else np.savez)(fh, **arrays)


@contextlib.contextmanager
def _open_regular(path, flags: int, verb: str):
    """A file descriptor on the regular file ``path`` (``flags`` | ``O_NOFOLLOW | O_NONBLOCK``):
    a link at the name is refused (ELOOP), a FIFO never waited on (``O_NONBLOCK``: ENXIO without
    a reader, else refused by ``fstat``), a device never written."""
    output_target(path)  # the plain reasons first: a link, a FIFO, a device, a directory
    try:
        fd = os.open(path, flags | _NOFOLLOW | _NONBLOCK | _CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # swapped for a link / FIFO / directory
            output_target(path)
        raise InputError(f"{path}: cannot {verb} ({exc.strerror or exc})") from None
    try:
        _refuse_kind(str(path), os.fstat(fd).st_mode)
        yield fd
    except OSError as exc:
        raise InputError(f"{path}: cannot {verb} ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def append_bytes(path, data: bytes) -> None:
    """Append ``data`` to the regular file ``path`` (created if missing) in one ``write`` to an
    ``O_APPEND`` descriptor (a short write, a full disk, goes on), then ``fsync``; a link, a FIFO
    or a device at ``path`` is refused, never opened for writing."""
    with _open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "append") as fd:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)


def truncate_file(path, size: int) -> None:
    """Cut the regular file ``path`` to ``size`` bytes and ``fsync`` it (as :func:`append_bytes`:
    never through a link, never a FIFO or device)."""
    with _open_regular(path, os.O_WRONLY, "truncate") as fd:
        os.ftruncate(fd, size)
        os.fsync(fd)


def check_output_path(out, *inputs) -> Path | None:
    """Refuse, before any work starts, an output no write can succeed on (:func:`output_target`:
    empty, a name over 255 bytes, a name ending in ``/``, anything but a regular file at the final
    name — a symlink, a FIFO, a device, a socket, a directory), one that is one of ``inputs``
    (the same real path, or the same file through a hard link), in a missing directory or in one
    we cannot write. Standard output passes. Returns ``Path(out)`` (None for None)."""
    if out is None:
        return None
    kind, target = output_target(out)
    if kind == "stdout":
        return Path(out)
    for inp in inputs:
        if inp is None or is_stdout(inp):
            continue
        if _same_file(target, Path(inp)):
            raise InputError(f"{out}: the output would overwrite the input {inp}; choose another name")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"{out}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{out}: directory {parent} is not writable")
    return Path(out)


def _same_file(out: Path, inp: Path) -> bool:
    """``out`` (the final name, not followed) is ``inp``: the same real path, or the same inode."""
    try:
        if os.path.realpath(out) == os.path.realpath(inp):
            return True
        a, b = os.lstat(out), os.stat(inp)
        return os.path.samestat(a, b)
    except (OSError, ValueError, RuntimeError):  # missing; RuntimeError: a symlink loop (Python < 3.13)
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
