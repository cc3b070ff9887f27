"""The input boundary: every file the package reads is opened, checked and decoded here.

- :func:`check_input` / :func:`open_input`: a path must name a regular file. A FIFO, a character
  or block device, a socket or a directory is refused *before* it is opened for reading, and the
  open itself never blocks (``O_NONBLOCK``, then ``fstat`` again on the descriptor: a file swapped
  for a FIFO between the two is still refused). OS errors (``ENOENT``, ``EACCES``, ``EISDIR``,
  ``ELOOP``, ``ENAMETOOLONG``, ``ENOTDIR``, ...) become one :class:`InputError` naming the path.
- :func:`read_text` / :func:`load_document`: a whole JSON or TOML file, its size checked against
  the memory left, decoded as strict UTF-8 (strict JSON: no ``NaN``/``Infinity``).
- :class:`NpzArchive` / :func:`read_npz` / :func:`check_npy_file`: ``.npz``/``.npy`` read only
  after every header checked (zip member compression stored/deflate, no encryption, ``.npy``
  magic, a numeric dtype, a shape of non-negative integers, a data size that the member holds and
  the memory left can take); zlib, CRC and truncation errors while reading are InputErrors.
- :class:`SafetensorsFile`: the safetensors header (JSON) checked (dtypes, shapes, offsets inside
  the file) before any tensor is mapped; bf16 and float8 tensors are converted exactly to float32
  (every bf16/fp8 value is a float32 value); other dtypes than integers and floats are refused.
- :func:`tensor_to_numpy`: a torch tensor as numpy: bf16/fp8 exactly as float32, sparse refused.
- :func:`display_name`: a file name as text that any UTF-8 writer takes (undecodable bytes shown
  as ``\\xNN``), for HTML and JSON outputs.

Core layer: the standard library and numpy only (torch is touched only through a tensor given).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import stat
import struct
import tomllib
import zipfile
import zlib
from pathlib import Path

import numpy as np

from routepack_opt.core.checks import shown
from routepack_opt.core.errors import InputError

try:
    import resource  # POSIX only
except ImportError:  # pragma: no cover
    resource = None  # type: ignore[assignment]

__all__ = ["check_input", "check_dir", "open_input", "read_bytes", "read_text", "load_document", "NpzArchive",
           "read_npz", "check_npy_file", "SafetensorsFile", "check_tensor", "tensor_to_numpy", "display_name",
           "available_memory", "check_dtype", "check_step_record", "check_tensors", "int_matrix", "is_int",
           "parse_json", "check_memory", "read_npy", "NAME_MAX", "PATH_MAX", "INT_MAX"]

NAME_MAX = 255
PATH_MAX = 4096
# A JSON/TOML document (a plan, a cost or config file, run.json) read whole: at most this much.
MAX_DOCUMENT_BYTES = 1 << 30
# An .npy header longer than this is not numpy's (numpy itself caps it at 10 kB by default).
MAX_NPY_HEADER = 1 << 16

_KIND_OF_MODE = ((stat.S_ISDIR, "is a directory, not a file"),
                 (stat.S_ISFIFO, "is a named pipe (FIFO), not a regular file"),
                 (stat.S_ISCHR, "is a character device, not a regular file"),
                 (stat.S_ISBLK, "is a block device, not a regular file"),
                 (stat.S_ISSOCK, "is a socket, not a regular file"))

_ERRNO_TEXT = {errno.ENOENT: "no such file",
               errno.EACCES: "permission denied",
               errno.EPERM: "permission denied",
               errno.EISDIR: "is a directory, not a file",
               errno.ELOOP: "too many levels of symbolic links",
               errno.ENAMETOOLONG: "file name too long",
               errno.ENOTDIR: "a part of the path is not a directory",
               errno.ENXIO: "no such device",
               errno.EIO: "input/output error"}


def _shown(path) -> str:
    """The path for a message: at most 200 characters, undecodable bytes as ``\\xNN``."""
    text = display_name(path)
    return text if len(text) <= 200 else text[:120] + "…" + text[-40:]


def display_name(name) -> str:
    """``name`` (a str, bytes or path) as text that encodes as UTF-8 whatever its bytes: the
    surrogate escapes of undecodable bytes become ``\\xNN``."""
    if isinstance(name, bytes):
        return name.decode("utf-8", "backslashreplace")
    text = os.fspath(name)
    if isinstance(text, bytes):
        return text.decode("utf-8", "backslashreplace")
    try:
        return os.fsencode(text).decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate that is no escaped byte (from JSON \ud800)
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _os_error(path, exc: OSError, what: str) -> InputError:
    if exc.errno == errno.ENOENT:
        return InputError(f"{_shown(path)}: no such {what}")
    reason = _ERRNO_TEXT.get(exc.errno or 0) or (exc.strerror or str(exc))
    return InputError(f"{_shown(path)}: {reason} ({what})")


def _check_name(path, what: str) -> str:
    if isinstance(path, bool) or not isinstance(path, (str, bytes, os.PathLike)):
        raise InputError(f"{what}: expected a file path, got {type(path).__name__} {shown(path)}")
    text = os.fsdecode(os.fspath(path))
    if text == "":
        raise InputError(f"{what}: the file name is empty")
    if "\0" in text:
        raise InputError(f"{_shown(text.replace(chr(0), '?'))}: a file name cannot hold a NUL byte ({what})")
    raw = os.fsencode(text)
    if len(raw) >= PATH_MAX:
        raise InputError(f"{_shown(text)}: the path is {len(raw)} bytes long; at most {PATH_MAX - 1} ({what})")
    for part in raw.split(b"/"):
        if len(part) > NAME_MAX:
            raise InputError(f"{_shown(text)}: a file name of {len(part)} bytes; at most {NAME_MAX} per "
                             f"name ({what})")
    return text


def _refuse_mode(text: str, mode: int, what: str) -> None:
    for test, reason in _KIND_OF_MODE:
        if test(mode):
            raise InputError(f"{_shown(text)}: {reason} ({what})")
    if not stat.S_ISREG(mode):
        raise InputError(f"{_shown(text)}: not a regular file ({what})")


def check_input(path, what: str = "input file") -> Path:
    """``Path(path)`` when it names an existing regular file (symlinks followed), else an
    InputError naming it: never opens anything."""
    text = _check_name(path, what)
    try:
        st = os.stat(text)
    except OSError as exc:
        raise _os_error(text, exc, what) from None
    _refuse_mode(text, st.st_mode, what)
    return Path(text)


def check_dir(path, what: str = "directory", must_exist: bool = True) -> Path:
    """``Path(path)`` when it names a directory (or, ``must_exist=False``, nothing yet), else an
    InputError naming it (a file, a FIFO, a name over 255 bytes, a symlink loop, ...)."""
    text = _check_name(path, what)
    try:
        st = os.stat(text)
    except FileNotFoundError:
        if must_exist:
            raise InputError(f"{_shown(text)}: no such directory ({what})") from None
        return Path(text)
    except OSError as exc:
        raise _os_error(text, exc, what) from None
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"{_shown(text)}: not a directory ({what})")
    return Path(text)


def _open_fd(path, what: str) -> tuple[int, os.stat_result, str]:
    text = str(check_input(path, what))
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(text, flags)
    except OSError as exc:
        raise _os_error(text, exc, what) from None
    try:
        st = os.fstat(fd)
        _refuse_mode(text, st.st_mode, what)  # swapped for a FIFO between stat and open
        with contextlib.suppress(AttributeError, OSError):
            import fcntl

            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd, st, text


def open_input(path, what: str = "input file", mode: str = "rb"):
    """The regular file ``path`` opened for reading (binary unless ``mode`` is ``"r"``), without
    blocking on a FIFO or device; see :func:`check_input` for what is refused."""
    fd, _, _ = _open_fd(path, what)
    try:
        if "b" in mode:
            return os.fdopen(fd, "rb")
        return os.fdopen(fd, "r", encoding="utf-8", errors="strict")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path, what: str = "input file", limit: int | None = None) -> bytes:
    """The whole regular file ``path``; refused when larger than ``limit`` bytes (default
    :data:`MAX_DOCUMENT_BYTES`) or than the memory left."""
    fd, st, text = _open_fd(path, what)
    limit = MAX_DOCUMENT_BYTES if limit is None else limit
    try:
        if st.st_size > limit:
            raise InputError(f"{_shown(text)}: {st.st_size:,} bytes; a {what} is at most {limit:,} bytes")
        check_memory(st.st_size * 3, f"{_shown(text)} ({what})")
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            data = fh.read(limit + 1)
    except OSError as exc:
        raise _os_error(text, exc, what) from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > limit:
        raise InputError(f"{_shown(text)}: more than {limit:,} bytes; a {what} is at most {limit:,} bytes")
    return data


def read_text(path, what: str = "input file", limit: int | None = None) -> str:
    """:func:`read_bytes` decoded as UTF-8 (an InputError naming the path when it is not)."""
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{_shown(path)}: not UTF-8 text at byte {exc.start} ({what})") from None


def _no_constant(name: str):
    raise json.JSONDecodeError(f"{name} is not a JSON number (strict JSON)", name, 0)


def parse_json(text: str | bytes, where: str, what: str):
    """Strict JSON (no NaN/Infinity); a malformed or too deeply nested text is an InputError."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{where}: not valid JSON ({exc})") from None
    except RecursionError:
        raise InputError(f"{where}: nested too deeply to be a {what}") from None


def load_document(path, what: str, fmt: str, build):
    """``build(data)`` of the TOML (``fmt="toml"``) or JSON (``"json"``) file at ``path``. A
    special file, a missing, unreadable or malformed file, or data ``build`` rejects, is one
    InputError that names the file (``what``: the kind of file, for the message)."""
    text = read_text(path, f"{what} file")
    where = _shown(path)
    if fmt == "toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"{where}: not valid TOML ({exc})") from None
        except RecursionError:
            raise InputError(f"{where}: nested too deeply to be a {what} file") from None
    else:
        data = parse_json(text, where, f"{what} file")
    try:
        return build(data)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
    except RecursionError:
        raise InputError(f"{where}: nested too deeply to be a {what} file") from None


# --- memory ------------------------------------------------------------------------------------
def available_memory() -> int | None:
    """Bytes this process can still allocate, by the tightest of: the address-space limit
    (``RLIMIT_AS``) less what is mapped, the cgroup's limit less its usage, and the machine's
    ``MemAvailable``; None when none of them can be read."""
    limits = []
    try:
        if resource is None:
            raise OSError("no resource module")
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            with open("/proc/self/statm") as fh:
                mapped = int(fh.read().split()[0]) * resource.getpagesize()
            limits.append(soft - mapped)
    except (ImportError, OSError, ValueError):
        pass
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),):
        try:
            with open(limit_file) as fh:
                raw = fh.read().strip()
            if raw != "max":
                with open(usage_file) as fh:
                    limits.append(int(raw) - int(fh.read().strip()))
        except (OSError, ValueError):
            pass
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    limits.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError):
        pass
    return max(0, min(limits)) if limits else None


def check_memory(nbytes: int, where: str) -> None:
    avail = available_memory()
    if avail is not None and nbytes > avail:
        raise InputError(f"{where}: needs about {nbytes / 2**30:.2f} GiB to read; only "
                         f"{avail / 2**30:.2f} GiB is available")


# --- arrays ------------------------------------------------------------------------------------
def check_dtype(dtype, where: str, allow_object: bool = False) -> np.dtype:
    """``dtype`` when it is an integer or float dtype (``allow_object``: or object, for the
    restricted unpickler of the replay reader); booleans, complex, strings, dates, records refused."""
    dt = np.dtype(dtype)
    if dt.kind in "iuf" and dt.fields is None and dt.subdtype is None:
        return dt
    if allow_object and dt.hasobject and dt.kind == "O":
        return dt
    raise InputError(f"{where}: dtype {dt.str} holds no integer or float numbers (integers or floats only)")


def _check_shape(shape, where: str) -> tuple[int, ...]:
    if not isinstance(shape, tuple) or not all(isinstance(x, int) and not isinstance(x, bool) for x in shape):
        raise InputError(f"{where}: the header's shape {shape!r:.60} is not a tuple of integers")
    if any(x < 0 for x in shape):
        raise InputError(f"{where}: the header's shape {shape} has a negative dimension")
    if len(shape) > 32:
        raise InputError(f"{where}: the header's shape has {len(shape)} dimensions (at most 32)")
    return shape


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    n = dtype.itemsize
    for x in shape:
        n *= x  # Python ints: no overflow
    return n


def read_npy_header(fh, where: str, allow_object: bool = False) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran_order, dtype, data bytes) of the ``.npy`` whose header ``fh`` is at,
    every field checked; ``fh`` is left at the first data byte."""
    try:
        version = np.lib.format.read_magic(fh)
        if version not in ((1, 0), (2, 0)):
            raise InputError(f"{where}: .npy format version {version} is not supported (np.save writes 1.0 or 2.0)")
        read = {(1, 0): np.lib.format.read_array_header_1_0}.get(version, np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read(fh, max_header_size=MAX_NPY_HEADER)
    except InputError:
        raise
    except (ValueError, OSError, EOFError, SyntaxError, TypeError, KeyError, zlib.error, zipfile.BadZipFile,
            NotImplementedError, RuntimeError, MemoryError, OverflowError) as exc:
        raise InputError(f"{where}: not a readable .npy array ({_brief(exc)})") from None
    shape = _check_shape(shape, where)
    dtype = check_dtype(dtype, where, allow_object)
    return shape, bool(fortran), dtype, (0 if dtype.hasobject else _nbytes(shape, dtype))


def _brief(exc: BaseException, limit: int = 100) -> str:
    text = " ".join(str(exc).split())
    text = f"{exc.__class__.__name__}: {text}" if text else exc.__class__.__name__
    return text if len(text) <= limit else text[:limit - 1] + "…"


# Errors of a damaged archive while its data is read: bad deflate data, a CRC mismatch, a cut file.
READ_ERRORS = (zlib.error, zipfile.BadZipFile, EOFError, OSError, ValueError, NotImplementedError,
               RuntimeError, struct.error, OverflowError)


class NpzArchive:
    """An ``.npz`` whose every member's zip entry and ``.npy`` header was checked when opened:
    members stored or deflated (no other method, no encryption), each one ``NAME.npy`` with a
    numeric dtype (or object, ``allow_object``), non-negative shape and a data size equal to what
    the entry's declared size holds. ``check_crc``: every member is also decompressed once
    (streamed, a block at a time) so a corrupt deflate stream or CRC is refused before any work.
    Read arrays with :meth:`read`; headers with :attr:`headers`. Close it (a context manager)."""

    def __init__(self, path, what: str = "archive", *, allow_object: bool = False, check_crc: bool = True,
                 memory_limit: int | None = None):
        _check_name(path, what)  # a path at all (None, 3, a list: an InputError, not a TypeError)
        self.path = path
        self.where = _shown(path)
        self._fh = open_input(path, what)
        try:
            try:
                self.zip = zipfile.ZipFile(self._fh)
            except (zipfile.BadZipFile, *READ_ERRORS) as exc:
                raise InputError(f"{self.where}: not a readable .npz archive ({_brief(exc)})") from None
            self.headers: dict[str, tuple[tuple[int, ...], bool, np.dtype, int]] = {}
            self.damaged: dict[str, str] = {}
            for info in self.zip.infolist():
                self._check_entry(info, allow_object)
            if check_crc:
                self._check_crc()
        except BaseException:
            self.close()
            raise

    def _check_entry(self, info: zipfile.ZipInfo, allow_object: bool) -> None:
        name = info.filename
        where = f"{self.where}[{display_name(name)}]"
        if info.flag_bits & 0x1:
            raise InputError(f"{where}: the member is encrypted; save the arrays unencrypted (np.savez)")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise InputError(f"{where}: compression method {info.compress_type} is not supported "
                             "(numpy writes stored or deflated members: np.savez / np.savez_compressed)")
        if not name.endswith(".npy"):
            return  # not an array: never read
        try:
            with self.zip.open(info) as fh:
                shape, fortran, dtype, nbytes = read_npy_header(fh, where, allow_object)
                offset = fh.tell()
        except InputError:
            raise
        except READ_ERRORS as exc:
            raise InputError(f"{where}: not a readable .npy member ({_brief(exc)})") from None
        if not dtype.hasobject and info.file_size != offset + nbytes:
            # raised when the member is read: a caller may first refuse the shape for its memory
            self.damaged[name[:-4]] = (f"{where}: the header says {shape} {dtype.str} ({nbytes:,} bytes) but the "
                                       f"member holds {max(0, info.file_size - offset):,} bytes of data "
                                       "(truncated or altered)")
        self.headers[name[:-4]] = (shape, fortran, dtype, nbytes)

    def _check_crc(self) -> None:
        for info in self.zip.infolist():
            try:
                with self.zip.open(info) as fh:
                    while fh.read(1 << 20):
                        pass
            except READ_ERRORS as exc:
                raise InputError(f"{self.where}[{display_name(info.filename)}]: damaged member "
                                 f"({_brief(exc)})") from None

    @property
    def files(self) -> list[str]:
        return list(self.headers)

    def read(self, key: str, where: str | None = None) -> np.ndarray:
        """Member ``key`` as an array; its size checked against the memory left first."""
        where = where or f"{self.where}[{display_name(key)}]"
        shape, fortran, dtype, nbytes = self.headers[key]
        if key in self.damaged:
            raise InputError(self.damaged[key])
        if dtype.hasobject:
            raise InputError(f"{where}: an object array; save numeric arrays")
        check_memory(nbytes, where)
        try:
            with self.zip.open(f"{key}.npy") as fh:
                read_npy_header(fh, where)
                raw = fh.read(nbytes)
        except InputError:
            raise
        except READ_ERRORS as exc:
            raise InputError(f"{where}: damaged member ({_brief(exc)})") from None
        if len(raw) != nbytes:
            raise InputError(f"{where}: truncated ({len(raw):,} of {nbytes:,} bytes)")
        arr = np.frombuffer(raw, dtype=dtype).reshape(shape, order="F" if fortran else "C")
        return arr

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if getattr(self, "zip", None) is not None:
                self.zip.close()
        with contextlib.suppress(Exception):
            self._fh.close()

    def __enter__(self) -> NpzArchive:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_npz(path, what: str, keys, required=()) -> dict[str, np.ndarray]:
    """The members ``keys`` (those present) of the ``.npz`` at ``path``; ``required`` ones must be
    there. Every header checked first (:class:`NpzArchive`)."""
    with NpzArchive(path, what) as arc:
        missing = [k for k in required if k not in arc.headers]
        if missing:
            raise InputError(f"{arc.where}: missing array '{missing[0]}' (has {sorted(arc.headers) or 'none'})")
        return {k: arc.read(k) for k in keys if k in arc.headers}


def check_npy_file(path, what: str = "array file", allow_object: bool = False):
    """(shape, fortran, dtype, nbytes) of an ``.npy`` file, its header checked and its data size
    against the file's size (a truncated file is refused before it is mapped)."""
    with open_input(path, what) as fh:
        head = read_npy_header(fh, _shown(path), allow_object)
        offset = fh.tell()
        size = os.fstat(fh.fileno()).st_size
    if not head[2].hasobject and size != offset + head[3]:
        raise InputError(f"{_shown(path)}: the header says {head[0]} {head[2].str} ({head[3]:,} bytes) but the "
                         f"file holds {max(0, size - offset):,} bytes of data (truncated or altered)")
    return head


def read_npy(path, what: str = "array file") -> np.ndarray:
    """A numeric ``.npy`` file, its header checked first (:func:`check_npy_file`)."""
    shape, fortran, dtype, nbytes = check_npy_file(path, what)
    check_memory(nbytes, _shown(path))
    with open_input(path, what) as fh:
        read_npy_header(fh, _shown(path))
        raw = fh.read(nbytes)
    if len(raw) != nbytes:
        raise InputError(f"{_shown(path)}: truncated ({len(raw):,} of {nbytes:,} bytes)")
    return np.frombuffer(raw, dtype=dtype).reshape(shape, order="F" if fortran else "C")


# --- 8- and 16-bit floats -------------------------------------------------------------------------
def _fp8_table(exp_bits: int, man_bits: int, bias: int, fn: bool) -> np.ndarray:
    """float32 value of each of the 256 codes of an fp8 format (``fn``: no infinities, only the
    all-ones code is NaN — e4m3fn; else IEEE-like — e5m2)."""
    out = np.empty(256, dtype=np.float32)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e = (code >> man_bits) & ((1 << exp_bits) - 1)
        m = code & ((1 << man_bits) - 1)
        top = (1 << exp_bits) - 1
        if fn and e == top and m == (1 << man_bits) - 1:
            v = float("nan")
        elif not fn and e == top:
            v = float("inf") if m == 0 else float("nan")
        elif e == 0:
            v = m / (1 << man_bits) * 2.0 ** (1 - bias)
        else:
            v = (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
        out[code] = sign * v
    return out


_FP8 = {"F8_E4M3": (4, 3, 7, True), "F8_E5M2": (5, 2, 15, False)}


def _bf16_to_f32(raw_u16: np.ndarray) -> np.ndarray:
    return (raw_u16.astype(np.uint32) << 16).view(np.float32)


# --- safetensors ---------------------------------------------------------------------------------
_ST_DTYPES = {"U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16, "U32": np.uint32,
              "I32": np.int32, "U64": np.uint64, "I64": np.int64, "F16": np.float16, "F32": np.float32,
              "F64": np.float64, "BF16": np.uint16, "F8_E4M3": np.uint8, "F8_E5M2": np.uint8}


class _StSlice:
    def __init__(self, owner: SafetensorsFile, key: str):
        self._owner, self._key = owner, key

    def get_shape(self) -> list[int]:
        return list(self._owner.header[self._key][1])

    def __getitem__(self, idx) -> np.ndarray:
        owner, key = self._owner, self._key
        shape = owner.header[key][1]
        if isinstance(idx, slice) and shape and idx.step in (None, 1):
            a, b, _ = idx.indices(shape[0])  # rows a..b only: the one sample the reader wants
            return owner._convert(key, owner._raw(key, a, max(a, b)))
        return owner._convert(key, owner._raw(key)[idx])


class SafetensorsFile:
    """A ``.safetensors`` file read without the safetensors library's surprises: the header (an
    8-byte length, then JSON) is checked whole — every dtype an integer or float one, every shape
    non-negative, every tensor's bytes inside the file at its declared size — before any tensor is
    read (into memory, never mapped). The interface of ``safe_open(..., framework="np")``:
    :meth:`keys`, :meth:`get_tensor`, :meth:`get_slice` (lazy ``[a:b]``)."""

    def __init__(self, path, what: str = "safetensors file"):
        self.where = _shown(path)
        with open_input(path, what) as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(8)
            if len(head) != 8:
                raise InputError(f"{self.where}: not a safetensors file (shorter than its 8-byte header length)")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, 100 << 20):
                raise InputError(f"{self.where}: the header length {n:,} exceeds the file ({size:,} bytes)")
            text = fh.read(n)
        try:
            meta = json.loads(text.decode("utf-8"), parse_constant=_no_constant)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise InputError(f"{self.where}: the safetensors header is not JSON ({_brief(exc, 60)})") from None
        if not isinstance(meta, dict):
            raise InputError(f"{self.where}: the safetensors header is not a JSON object")
        self.path = str(path)
        self.data_start = 8 + n
        self.header: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        for key, entry in meta.items():
            if key == "__metadata__":
                continue
            where = f"{self.where}[{display_name(key)}]"
            if not isinstance(entry, dict):
                raise InputError(f"{where}: a header entry that is not an object")
            dt = entry.get("dtype")
            if dt not in _ST_DTYPES:
                raise InputError(f"{where}: dtype {dt!r:.20} holds no integer or float numbers "
                                 f"(supported: {', '.join(_ST_DTYPES)})")
            shape = entry.get("shape")
            offs = entry.get("data_offsets")
            if not isinstance(shape, list):
                raise InputError(f"{where}: shape must be a list of integers")
            shape_t = _check_shape(tuple(shape), where)
            if (not isinstance(offs, list) or len(offs) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) for x in offs)):
                raise InputError(f"{where}: data_offsets must be two integers")
            lo, hi = offs
            nbytes = _nbytes(shape_t, np.dtype(_ST_DTYPES[dt]))
            if not 0 <= lo <= hi or hi - lo != nbytes or self.data_start + hi > size:
                raise InputError(f"{where}: data_offsets {offs} do not hold {shape_t} {dt} ({nbytes:,} bytes) "
                                 f"inside the file ({size:,} bytes)")
            self.header[key] = (dt, shape_t, lo, hi)

    def keys(self) -> list[str]:
        return list(self.header)

    def _raw(self, key: str, first: int | None = None, stop: int | None = None) -> np.ndarray:
        """The tensor's raw values (rows ``first:stop`` of its first axis, else all), read into
        memory with ``pread`` — never memory-mapped: a file truncated while a mapping of it is
        read kills the process with SIGBUS. A read that returns fewer bytes than the header
        promised (the file was cut meanwhile) is an InputError."""
        dt, shape, lo, hi = self.header[key]
        dtype = np.dtype(_ST_DTYPES[dt])
        if first is not None and shape:
            per_row = _nbytes(shape[1:], dtype)
            shape = (stop - first, *shape[1:])
            lo, hi = lo + first * per_row, lo + stop * per_row
        if hi == lo:
            return np.zeros(shape, dtype=dtype)
        where = f"{self.where}[{display_name(key)}]"
        check_memory(hi - lo, where)
        parts, at, need = [], self.data_start + lo, hi - lo
        try:
            with open_input(self.path, "safetensors file") as fh:
                while need:
                    chunk = os.pread(fh.fileno(), min(need, 1 << 30), at)
                    if not chunk:
                        break
                    parts.append(chunk)
                    at += len(chunk)
                    need -= len(chunk)
        except OSError as exc:
            raise InputError(f"{where}: cannot read ({_brief(exc, 60)})") from None
        if need:
            raise InputError(f"{where}: truncated while it was read ({hi - lo - need:,} of {hi - lo:,} bytes); "
                             "read it again once its writer has finished")
        return np.frombuffer(b"".join(parts), dtype=dtype).reshape(shape)

    def _convert(self, key: str, raw: np.ndarray) -> np.ndarray:
        dt = self.header[key][0]
        if dt == "BF16":
            return _bf16_to_f32(np.asarray(raw))
        if dt in _FP8:
            return _fp8_table(*_FP8[dt])[np.asarray(raw)]
        return raw

    def get_tensor(self, key: str) -> np.ndarray:
        dt, shape, lo, hi = self.header[key]
        check_memory(hi - lo, f"{self.where}[{display_name(key)}]")
        return np.array(self._convert(key, self._raw(key)))

    def get_slice(self, key: str) -> _StSlice:
        return _StSlice(self, key)


_TORCH_SMALL_FLOATS = ("torch.bfloat16", "torch.float8_e4m3fn", "torch.float8_e5m2", "torch.float8_e4m3fnuz",
                       "torch.float8_e5m2fnuz", "torch.float8_e8m0fnu")


# --- torch tensors -------------------------------------------------------------------------------
def check_tensors(obj, where: str, depth: int = 0) -> None:
    """Refuse, right after a ``.pt`` is loaded, the tensors no reader can slice: sparse or
    quantized ones (in the object, its lists, tuples and dicts, a few levels deep)."""
    if depth > 4:
        return
    if hasattr(obj, "layout") and hasattr(obj, "detach"):
        if str(obj.layout) != "torch.strided":
            raise InputError(f"{where}: holds a sparse tensor ({obj.layout}); save it dense (tensor.to_dense())")
        if getattr(obj, "is_quantized", False):
            raise InputError(f"{where}: holds a quantized tensor; save integer expert ids")
        return
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        items = list(obj)
    else:
        return
    for item in items[:100000]:
        check_tensors(item, where, depth + 1)


def check_tensor(x, what: str) -> None:
    """Refuse the torch tensors no reader can take as an array: nested, sparse, quantized, or on
    the meta device (no data)."""
    if getattr(x, "is_nested", False):
        raise InputError(f"{what}: a nested tensor; pass one dense tensor (or a list of tensors)")
    if str(x.layout) != "torch.strided":
        raise InputError(f"{what}: a sparse tensor ({x.layout}); save it dense (tensor.to_dense())")
    if getattr(x, "is_quantized", False):
        raise InputError(f"{what}: a quantized tensor ({x.dtype}); save integer expert ids or counts")
    if getattr(getattr(x, "device", None), "type", None) == "meta":
        raise InputError(f"{what}: a tensor on the meta device holds no data")


def tensor_to_numpy(x, what: str) -> np.ndarray:
    """A CPU numpy array of the torch tensor ``x``: bf16 and float8 converted exactly to float32
    (every value of theirs is a float32 value), complex/bool kept for the caller's dtype check,
    sparse or quantized tensors refused."""
    # duck-typed: core imports no torch (a tensor in hand has what we need as methods)
    check_tensor(x, what)
    x = x.detach()
    if x.device.type != "cpu":
        x = x.cpu()
    if str(x.dtype) in _TORCH_SMALL_FLOATS:  # every value of theirs is a float32 value
        x = x.float()
    if x.is_complex():
        raise InputError(f"{what}: complex tensor ({x.dtype}); expected integers")
    try:
        return x.numpy()
    except (TypeError, RuntimeError) as exc:
        raise InputError(f"{what}: tensor of dtype {x.dtype} cannot be read ({_brief(exc, 60)})") from None


# --- schema checks of JSON documents -----------------------------------------------------------------
INT_MAX = 2**31 - 1  # sample ids, expert ids, slots, counts in a plan: int32 everywhere


def is_int(x) -> bool:
    """A JSON integer: an ``int`` that is not a ``bool`` (never a float, a string or None)."""
    return isinstance(x, int) and not isinstance(x, bool)


def int_matrix(raw, name: str, lo: int = 0, hi: int = INT_MAX, rows: int | None = None,
               cols: int | None = None) -> np.ndarray:
    """``raw`` (JSON) as an int64 ``[rows, cols]`` array of integers in ``lo..hi``: a list of
    equally long, non-empty lists of ints (no bool, float, str), else an InputError naming ``name``."""
    shape = f"{rows if rows is not None else 'L'} lists of {cols if cols is not None else 'n'} integers"
    if not isinstance(raw, list) or not raw or not all(isinstance(r, list) and r for r in raw):
        raise InputError(f"{name} must be {shape} (non-empty)")
    if rows is not None and len(raw) != rows:
        raise InputError(f"{name} must be {shape}; it has {len(raw)} lists")
    widths = {len(r) for r in raw}
    if len(widths) != 1 or (cols is not None and widths != {cols}):
        raise InputError(f"{name} must be {shape}; its lists have {sorted(widths)[:4]} entries")
    for r in raw:
        for x in r:
            if not is_int(x):
                raise InputError(f"{name} must be {shape}; found {type(x).__name__} {x!r:.30}")
            if not lo <= x <= hi:
                raise InputError(f"{name}: {x} is out of range {lo}..{hi}")
    return np.asarray(raw, dtype=np.int64)


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _need(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise InputError(f"{where}: {what}")


_STEP_INT_MAX = 2**62  # steps, rows, counts: far beyond any run, far inside int64
_STEP_SECONDS_MAX = 1e9  # a timing no run writes (31 years)


def _brief_value(x) -> str:
    """A JSON value as the file wrote it, cut to 40 characters."""
    text = json.dumps(x) if isinstance(x, (int, float, str, bool)) or x is None else type(x).__name__
    return text if len(text) <= 40 else text[:39] + "…"


def _is_count(x, lo: int = 0, hi: int = _STEP_INT_MAX) -> bool:
    return is_int(x) and lo <= x <= hi


def _is_nonneg(x) -> bool:
    return _is_num(x) and x >= 0


def _is_saving(x) -> bool:
    """A saving (b − ours) / b of a makespan ours ≥ 0: finite and at most 1."""
    return _is_num(x) and x <= 1.0


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def check_step_record(rec, where: str) -> dict:
    """One ``steps.jsonl`` line of ``replay-report`` (report_run's record), checked field by field
    against what a run writes: integers (never a float, a bool or a string) in range for the
    step, the rows and the counts; makespans, bounds and gaps finite and ≥ 0, the bound at most
    the makespan; savings finite,
    at most 1 and equal to (baseline − ours) / baseline of the line's own makespans; the best
    baseline one that keeps the cap, with the least makespan of those; timings finite seconds
    ≥ 0. An InputError names the line and the field (``report_run.read_steps`` skips such a
    line with a note)."""
    _need(isinstance(rec, dict), where, "not a step record (a JSON object)")
    _need(isinstance(rec.get("window"), str) and rec["window"] != "", where, "'window' must be a file name")
    if "step" in rec:
        _need(_is_count(rec["step"]), where, f"'step' must be an integer in 0..2^62, got {_brief_value(rec['step'])}")
    t = rec.get("timings", {})
    _need(isinstance(t, dict) and all(_is_nonneg(v) and v <= _STEP_SECONDS_MAX for v in t.values()), where,
          "'timings' must be an object of seconds (finite numbers ≥ 0)")
    if "error" in rec:
        _need(isinstance(rec["error"], str), where, "'error' must be a string")
        return rec
    for k in ("samples", "tokens", "layers", "experts"):
        if k in rec:
            _need(_is_count(rec[k]), where, f"'{k}' must be an integer in 0..2^62, got {_brief_value(rec[k])}")
    top = rec["samples"] if _is_count(rec.get("samples"), 1) else _STEP_INT_MAX
    _need(_is_count(rec.get("rows"), 1, top), where,
          f"'rows' must be an integer in 1..{top}, got {_brief_value(rec.get('rows'))}")
    for k in ("makespan", "lower_bound", "gap"):
        _need(_is_nonneg(rec.get(k)), where, f"'{k}' must be a finite number ≥ 0, got {_brief_value(rec.get(k))}")
    # a valid lower bound is never above the plan's makespan (the evaluator's bound of the window)
    _need(rec["lower_bound"] <= rec["makespan"] * (1 + 1e-9) + 1e-9, where,
          f"'lower_bound' {_brief_value(rec['lower_bound'])} is above the plan's makespan")
    _need(rec.get("saving") is None or _is_saving(rec["saving"]), where,
          f"'saving' must be a finite number ≤ 1 or null, got {_brief_value(rec.get('saving'))}")
    _need(rec.get("rows_saved") is None or _is_count(rec["rows_saved"], -_STEP_INT_MAX), where,
          "'rows_saved' must be an integer or null")
    _need(rec.get("best_baseline") is None or isinstance(rec["best_baseline"], str), where,
          "'best_baseline' must be a string or null")
    cert = rec.get("certificate")
    if isinstance(cert, dict) and cert.get("rows") is not None:
        _need(_is_count(cert["rows"], 1, rec["rows"]), where, "'certificate.rows' (R*) must be an integer in 1..rows")
    base = rec.get("baselines")
    _need(isinstance(base, dict), where, "'baselines' must be an object")
    for name, b in base.items():
        _need(isinstance(b, dict), where, f"baselines[{name!r:.30}] must be an object")
        if "makespan" in b:
            for k in ("makespan", "gap"):
                _need(_is_nonneg(b.get(k)), where, f"baselines[{name!r:.30}].{k} must be a finite number ≥ 0")
            _need(_is_saving(b.get("saving")), where, f"baselines[{name!r:.30}].saving must be a finite number ≤ 1")
            if b["makespan"] > 0:
                _need(_close(b["saving"], (b["makespan"] - rec["makespan"]) / b["makespan"]), where,
                      f"baselines[{name!r:.30}].saving is not (its makespan − the plan's) / its makespan")
            _need(_is_count(b.get("cap_violations")), where, f"baselines[{name!r:.30}].cap_violations must be "
                  "an integer ≥ 0")
            _need(_is_count(b.get("rows"), 1), where, f"baselines[{name!r:.30}].rows must be an integer ≥ 1")
            _need(_is_count(b.get("extra_rows"), -_STEP_INT_MAX), where,
                  f"baselines[{name!r:.30}].extra_rows must be an integer")
        else:
            _need(isinstance(b.get("error"), str), where, f"baselines[{name!r:.30}] needs makespan or error")
    best = rec.get("best_baseline")
    if best is not None:
        _need(best in base and "makespan" in base[best], where, "'best_baseline' names no baseline of the line")
        b = base[best]
        _need(b["cap_violations"] == 0, where, f"'best_baseline' {best!r:.30} breaks the cap")
        _need(all(o["makespan"] >= b["makespan"] for o in base.values()
                  if "makespan" in o and o["cap_violations"] == 0), where,
              f"'best_baseline' {best!r:.30} is not the cap-keeping baseline of least makespan")
        _need(rec.get("saving") is not None and _close(rec["saving"], b["saving"]), where,
              "'saving' is not the best baseline's saving")
        _need(rec.get("rows_saved") is None or rec["rows_saved"] == b["rows"] - rec["rows"], where,
              "'rows_saved' is not the best baseline's rows − the plan's rows")
    else:
        _need(rec.get("saving") is None, where, "'saving' without a best baseline")
    ep = rec.get("ep_imbalance")
    _need(isinstance(ep, dict) and all(v is None or _is_nonneg(v) for v in ep.values()), where,
          "'ep_imbalance' must be an object of numbers ≥ 0")
    _need("routepack" in ep and all(k in ep for k in ("identity", "eplb")), where,
          "'ep_imbalance' needs routepack, identity and eplb")
    for key in ("time_split", "time_split_best_baseline"):
        if key == "time_split" or key in rec:
            ts = rec.get(key)
            _need(isinstance(ts, dict) and all(_is_nonneg(ts.get(k)) for k in ("attention", "experts", "overhead")),
                  where, f"'{key}' must hold attention, experts and overhead numbers ≥ 0")
    return rec
