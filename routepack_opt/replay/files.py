"""The containers routing replays are saved in, read without running code from them: ``.npy``
and ``.npz`` (object members through a restricted unpickler), ``.pt`` by torch's weights-only
loader, ``.safetensors`` by slices; and a loaded mapping unpacked by the format's keys.

Nothing is memory-mapped: a file that another process truncates while a mapping of it is read
kills the reader with SIGBUS (no ``error:`` line, rc 135). Every array is read into memory
(:func:`os.read`/``pread``) after its size is checked against the memory left, and the number of
bytes read is checked after the read: a file cut short while it is read is an InputError.
"""

from __future__ import annotations

import functools
import importlib
import io
import os
import pickle
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from routepack_opt.core import inputs
from routepack_opt.core.errors import InputError
from routepack_opt.replay import _deps
from routepack_opt.replay.routes import _ANSI, _brief


@functools.cache
def _numpy_globals() -> dict[str, object]:
    """What a pickle of numeric numpy arrays needs, and nothing else: ``_reconstruct`` (under
    numpy 1's and numpy 2's module names), ``ndarray``, ``dtype``, numeric scalars and the
    numeric/bool/object dtype classes. None of them runs code given by the file."""
    try:
        ma = importlib.import_module("numpy._core.multiarray")
    except ImportError:  # numpy 1
        ma = importlib.import_module("numpy.core.multiarray")
    out: dict[str, object] = {"numpy.ndarray": np.ndarray, "numpy.dtype": np.dtype}
    for mod in ("numpy._core.multiarray", "numpy.core.multiarray"):
        out[f"{mod}._reconstruct"] = ma._reconstruct
        out[f"{mod}.scalar"] = ma.scalar
    for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
              np.float16, np.float32, np.float64, np.bool_, np.object_):
        cls = type(np.dtype(t))
        if cls is not np.dtype:  # numpy ≥ 1.25: one class per dtype (numpy.dtypes.Int64DType, ...)
            out[f"numpy.dtypes.{cls.__name__}"] = cls
    return out


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """The restricted unpickler of Python's docs ("Restricting Globals"): it resolves only the
    numpy names of :func:`_numpy_globals`, so an object ``.npy`` of numeric arrays loads and
    anything else (a function, a class, ``os.system``) is refused before it is called."""

    def find_class(self, module, name):
        obj = _numpy_globals().get(f"{module}.{name}")
        if obj is None:
            raise pickle.UnpicklingError(f"refused global {module}.{name}")
        return obj


_SAVE_HINT = "save each sample as a numeric array (np.savez(path, *arrays) or a .pt of tensors)"


def _read_npy(fh, where: str):
    """One ``.npy`` (a file or an ``.npz`` member): numeric arrays read into memory (their size
    checked against the memory left first, and against what the read returned after), object
    arrays through :class:`_NumpyOnlyUnpickler`."""
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    else:
        raise InputError(f"{where}: .npy format version {version} is not supported (save with numpy's np.save)")
    if not dtype.hasobject:
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        inputs.check_memory(size, where)
        raw = fh.read(size)
        if len(raw) != size:
            raise InputError(f"{where}: truncated ({len(raw)} of {size} bytes)")
        return np.frombuffer(raw, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    try:
        arr = _NumpyOnlyUnpickler(fh).load()
    except Exception as exc:
        raise InputError(f"{where}: an object array of more than numeric arrays ({_brief(exc, 50)}); "
                         f"{_SAVE_HINT}") from None
    if not isinstance(arr, np.ndarray):
        raise InputError(f"{where}: the object array did not load as an array; {_SAVE_HINT}")
    return arr


class _NpzSamples:
    """An ``.npz`` of positional members ``arr_0 .. arr_{N-1}`` (``np.savez(path, *arrays)``) as a
    per-sample sequence, each member read when its sample is."""

    def __init__(self, data, path: Path, n: int):
        self._data, self._path, self._n = data, path, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int):
        return _npz_member(self._data, self._path, f"arr_{i}")


class _NpzMembers(Mapping):
    """The named members of an ``.npz``, each read when it is looked up."""

    def __init__(self, data, path: Path):
        self._data, self._path = data, path

    def __getitem__(self, key):
        if key not in self._data.files:
            raise KeyError(key)
        return _npz_member(self._data, self._path, key)

    def __iter__(self):
        return iter(self._data.files)

    def __len__(self) -> int:
        return len(self._data.files)


def _npz_member(data, path: Path, key: str):
    try:
        with data.zip.open(f"{key}.npy") as fh:
            return _read_npy(fh, f"{path}[{key}]")
    except InputError:
        raise
    except inputs.READ_ERRORS as exc:  # bad deflate data, CRC, truncation
        raise InputError(f"{path}[{key}]: damaged member ({_brief(exc, 60)})") from None


def _load_npz(path: Path):
    # every member's zip entry and .npy header checked, and its data decompressed once, first
    data = inputs.NpzArchive(path, "routes file", allow_object=True)
    if data.damaged:  # a member whose header's size is not what it holds
        raise InputError(next(iter(data.damaged.values())))
    names = data.files
    positional = sorted((n for n in names if re.fullmatch(r"arr_\d+", n)), key=lambda n: int(n[4:]))
    if positional and len(positional) == len(names):
        if [int(n[4:]) for n in positional] != list(range(len(positional))):
            raise InputError(f"{path}: positional arrays arr_0.. are not numbered 0..{len(positional) - 1}")
        return _NpzSamples(data, path, len(positional))
    return _NpzMembers(data, path)


def _read_whole(path: Path, what: str) -> bytes:
    """The file's bytes, read into memory: its size (``fstat`` of the open file) checked against
    the memory left first, the bytes read against that size after (cut short while it was read:
    an InputError, never a fault)."""
    with inputs.open_input(path, what) as fh:
        size = os.fstat(fh.fileno()).st_size
        inputs.check_memory(2 * size, f"{path} ({what})")
        data = fh.read(size)
    if len(data) != size:
        raise InputError(f"{path}: truncated while it was read ({len(data):,} of {size:,} bytes); "
                         "read it again once its writer has finished")
    return data


def _load_pt(path: Path):
    """``torch.load`` with ``weights_only=True`` and numpy's array types allowed (never a full
    unpickle): tensors, numpy arrays, lists, tuples, dicts and numbers load; anything else is
    refused with the global that was refused. Read from the bytes of the file in memory, not
    memory-mapped (``mmap=True`` would die by SIGBUS on a file truncated while it is read)."""
    torch = _deps.torch()
    allowed = [(obj, name) for name, obj in _numpy_globals().items()]
    data = _read_whole(path, "routes file")
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", _ANSI.sub("", str(exc)))
        if found is None:  # torch's own reason is the line after its long preamble
            why = re.search(r"WeightsUnpickler error:\s*([^\n]+)", _ANSI.sub("", str(exc)))
            reason = why.group(1).strip()[:80] if why else _brief(exc, 80)
            raise InputError(f"{path}: not a readable .pt file ({reason})") from None
        raise InputError(f"{path}: holds '{found.group(1)}', which the safe loader refuses; save the routes "
                         "as tensors or numeric numpy arrays (in lists or dicts)") from None


def _load_file(path: Path):
    """The routes container in a file: an array, a tensor, a per-sample sequence or a mapping."""
    inputs.check_input(path, "routes file")  # a FIFO, device or directory: refused, never opened
    suf = path.suffix.lower()
    try:
        if suf == ".npy":
            inputs.check_npy_file(path, "routes file", allow_object=True)
            with inputs.open_input(path, "routes file") as fh:
                return _read_npy(fh, str(path))
        if suf == ".npz":
            return _load_npz(path)
        if suf == ".safetensors":
            return _SafetensorsMembers(inputs.SafetensorsFile(path))
        if suf in (".pt", ".pth"):
            loaded = _load_pt(path)
            inputs.check_tensors(loaded, str(path))  # sparse / quantized: refused before any slicing
            return loaded
    except InputError:
        raise
    except ImportError as exc:
        raise InputError(f"{path}: reading it needs {exc.name} (pip install {exc.name})") from None
    except Exception as exc:
        raise InputError(f"{path}: not a readable routes file ({_brief(exc)})") from None
    raise InputError(f"{path}: unknown routes file type '{suf}' (use .npy, .npz, .pt or .safetensors)")


class _SafetensorsMembers(Mapping):
    """A safetensors file's tensors; ``routes`` and ``routed_experts`` stay lazy (read by slices)."""

    def __init__(self, fh):
        self._fh = fh

    def __getitem__(self, key):
        if key not in self._fh.keys():
            raise KeyError(key)
        if key in ("routes", "routed_experts", "rollout_routed_experts"):
            return _SafetensorsSlices(self._fh, key)
        return self._fh.get_tensor(key)

    def __iter__(self):
        return iter(self._fh.keys())

    def __len__(self) -> int:
        return len(self._fh.keys())


class _SafetensorsSlices:
    """Lazy ``tensor[a:b]`` over a safetensors member (one sample read at a time)."""

    def __init__(self, fh, key: str):
        self._slice = fh.get_slice(key)
        self.shape = tuple(self._slice.get_shape())

    def __getitem__(self, key):
        return np.asarray(self._slice[key])


# Keys of a mapping, per format: (routes key(s), lengths key(s)); verl's mask is its own key.
_KEYS = {"slime": (("rollout_routed_experts", "routes"), ("total_lengths", "lengths")),
         "verl": (("routed_experts",), ()),
         "routes": (("routes",), ("lengths",))}
_FORMAT_OF_KEY = {"rollout_routed_experts": "slime", "routed_experts": "verl", "routes": "routes"}


def _unpack(loaded, format: str, where: str, lengths, attention_mask):
    """(routes, lengths, attention_mask) out of a loaded container, by the format's keys."""
    if not isinstance(loaded, Mapping):
        return loaded, lengths, attention_mask
    keys = sorted(str(k) for k in loaded)
    route_keys, length_keys = _KEYS[format]
    key = next((k for k in route_keys if k in loaded), None)
    if key is None:
        other = next((f for k, f in _FORMAT_OF_KEY.items() if k in loaded and f != format), None)
        hint = f"; it looks like format '{other}'" if other else ""
        shown = ", ".join(keys[:6]) + (", …" if len(keys) > 6 else "")
        raise InputError(f"{where}: missing '{route_keys[0]}' for format '{format}' (has {shown or 'nothing'}){hint}")
    if lengths is None:
        lengths = next((loaded[k] for k in length_keys if k in loaded), None)
    if format == "verl" and attention_mask is None and "attention_mask" in loaded:
        attention_mask = loaded["attention_mask"]
    return loaded[key], lengths, attention_mask


def _lengths_arg(lengths):
    if isinstance(lengths, (str, Path)):
        p = Path(lengths)
        try:
            return inputs.read_npy(p, "lengths file")
        except InputError:
            raise
        except Exception as exc:
            raise InputError(f"{p}: not a readable .npy lengths vector ({_brief(exc, 60)})") from None
    return lengths


