"""The one check of each argument that many entry points share (PyVRP's habit: validate once,
at the boundary, with a message a user can act on). Entry points call these instead of writing
the rule again; ``name`` is how the caller's user spells the argument.

Every refusal is an :class:`InputError` that names the argument and quotes what the user gave
(:func:`shown`), never a value derived from it (a cast that wrapped, a NaN turned into
−2⁶³). Integers are exact: ``int`` or a numpy integer, never a ``bool``, a float (``2.5`` is not
truncated to 2, ``2.0`` is not an integer either) or a string; arrays of integers are checked
before any cast (:func:`int_array`), so an out-of-range value is refused, never wrapped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TypeGuard

import numpy as np

from routepack_opt.core.errors import InputError

__all__ = ["shown", "is_integer", "check_int", "check_number", "check_time_limit", "check_optional_time_limit",
           "check_bool", "check_choice", "check_type", "check_path", "int_array", "check_redundant_experts",
           "INT32_MAX", "INT64_MAX", "MAX_CAPACITY", "MAX_WORKERS",
           "check_positive_int", "check_known_options"]

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
MAX_CAPACITY = 2**40  # tokens of one micro-batch / one bin (Topology's and the CLI's limit)
MAX_WORKERS = 1024  # solver threads a caller may ask for (CP-SAT's num_workers, HiGHS threads)


def shown(value, limit: int = 60) -> str:
    """``repr(value)`` for a message, at most ``limit`` characters (arrays: dtype and shape and a
    few entries), never raising (a hostile ``__repr__`` is shown by its type)."""
    if isinstance(value, np.ndarray):
        head = np.array2string(value.ravel()[:4], threshold=4, separator=", ") if value.size else "[]"
        text = f"{value.dtype} array of shape {tuple(value.shape)} ({head}{'…' if value.size > 4 else ''})"
    else:
        try:
            text = repr(value)
        except Exception:  # noqa: BLE001 - a repr that raises is still a value to name
            text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 1] + "…"


def is_integer(value) -> TypeGuard[int | np.integer]:
    """An exact integer scalar: ``int`` or a numpy integer, not a ``bool`` (nor a float, a string)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _range_text(lo, hi) -> str:
    if lo is not None and hi is not None:
        return f"in {lo:,}..{hi:,}" if is_integer(lo) else f"in [{lo}, {hi}]"
    if lo is not None:
        return f"≥ {lo:,}" if is_integer(lo) else f"≥ {lo}"
    if hi is not None:
        return f"≤ {hi:,}" if is_integer(hi) else f"≤ {hi}"
    return ""


def check_int(value, name: str, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` as an ``int`` when it is an exact integer in ``lo..hi`` (either bound optional),
    else an InputError naming ``name`` and quoting ``value``."""
    rng = _range_text(lo, hi)
    if not is_integer(value):
        raise InputError(f"{name}: expected an integer{' ' + rng if rng else ''}, got {shown(value)}")
    v = int(value)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise InputError(f"{name}: expected an integer {rng}, got {shown(value)}")
    return v


def check_number(value, name: str, lo: float | None = None, hi: float | None = None, *,
                 lo_open: bool = False) -> float:
    """``value`` as a finite ``float`` in ``[lo, hi]`` (``lo_open``: ``> lo``), an int or float
    (numpy's included) that is not a bool; else an InputError naming ``name``."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if ok:
        try:
            v = float(value)
        except OverflowError:  # an int beyond the float range
            ok = False
    if not ok or not math.isfinite(v):
        raise InputError(f"{name}: expected a finite number, got {shown(value)}")
    if (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
        lo_text = "" if lo is None else (f"> {lo}" if lo_open else f"≥ {lo}")
        hi_text = "" if hi is None else f"≤ {hi}"
        raise InputError(f"{name}: expected a number {' and '.join(t for t in (lo_text, hi_text) if t)}, "
                         f"got {shown(value)}")
    return v


def check_time_limit(value, name: str = "time limit", *, allow_inf: bool = False) -> float:
    """A time limit: a finite number of seconds > 0 (None, no limit, is for the caller to allow;
    ``allow_inf``: +inf too, for the internal stages whose callers pass "no limit" as inf)."""
    if allow_inf and isinstance(value, (float, np.floating)) and value == math.inf:
        return math.inf
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)) \
            or isinstance(value, np.complexfloating) or not math.isfinite(value) or value <= 0:
        raise InputError(f"{name} must be a positive number of seconds, got {shown(value)}")
    return float(value)


def check_optional_time_limit(value, name: str = "time limit") -> float | None:
    """:func:`check_time_limit`, or None (no limit)."""
    return None if value is None else check_time_limit(value, name)


def check_bool(value, name: str) -> bool:
    """``True``/``False`` (numpy's included); not 0/1, not a string."""
    if not isinstance(value, (bool, np.bool_)):
        raise InputError(f"{name}: expected True or False, got {shown(value)}")
    return bool(value)


def check_choice(value, name: str, choices: Iterable[str]) -> str:
    """``value`` when it is one of the names ``choices`` (a str), else an InputError listing them
    (never a KeyError)."""
    options = tuple(choices)
    if not isinstance(value, str) or value not in options:
        raise InputError(f"{name}: expected one of {', '.join(options)}, got {shown(value)}")
    return value


def check_type(value, name: str, cls, what: str | None = None):
    """``value`` when it is an instance of ``cls`` (a type or a tuple of types), else an
    InputError naming ``name`` and what was given."""
    if not isinstance(value, cls):
        want = what or (cls.__name__ if isinstance(cls, type) else " or ".join(c.__name__ for c in cls))
        raise InputError(f"{name}: expected a {want}, got {type(value).__name__} {shown(value, 40)}")
    return value


def check_path(value, name: str) -> str:
    """A file name (str, bytes or os.PathLike; not empty, no NUL byte, within the OS's length
    limits) as text; it is not opened (the input boundary, :mod:`routepack_opt.core.inputs`,
    checks what it names)."""
    from routepack_opt.core.inputs import _check_name

    return _check_name(value, name)


def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(x) for x in np.argwhere(mask)[0])


def _at(idx: tuple[int, ...]) -> str:
    return f"the entry at [{', '.join(map(str, idx))}]" if idx else "the value"


def int_array(value, name: str, *, ndim: int | None = None, lo: int | None = None, hi: int | None = None,
              dtype=np.int64) -> np.ndarray:
    """``value`` (a list, an array, a CPU torch tensor) as a ``dtype`` array of exact integers in
    ``lo..hi`` (default: ``dtype``'s range), of rank ``ndim`` when given. Integer arrays are
    range-checked before the cast; float arrays are taken only when every value is finite, whole
    and in range (checked as floats); object arrays only of Python/numpy integers. Booleans,
    strings, complex, ragged lists are refused. The message quotes the value given and its index."""
    if hasattr(value, "detach") and hasattr(value, "layout"):  # a torch tensor (core imports no torch)
        from routepack_opt.core.inputs import tensor_to_numpy

        value = tensor_to_numpy(value, name)
    try:
        arr = np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - ragged lists and the like
        raise InputError(f"{name}: cannot be read as an array of integers ({type(exc).__name__})") from None
    if ndim is not None and arr.ndim != ndim:
        raise InputError(f"{name}: expected {ndim} dimension{'s' if ndim != 1 else ''}, got shape {tuple(arr.shape)}")
    info = np.iinfo(dtype)
    rng = _range_text(lo, hi) if lo is not None or hi is not None else f"in the {np.dtype(dtype).name} range"
    lo = info.min if lo is None else max(lo, info.min)
    hi = info.max if hi is None else min(hi, info.max)
    if arr.dtype == object:
        flat = arr.ravel()
        bad = [k for k, x in enumerate(flat) if not is_integer(x)]
        if bad:
            idx = np.unravel_index(bad[0], arr.shape)
            raise InputError(f"{name}: expected integers; {_at(tuple(map(int, idx)))} is "
                             f"{shown(flat[bad[0]], 40)}")
        out_of = [k for k, x in enumerate(flat) if not lo <= int(x) <= hi]
        if out_of:
            idx = np.unravel_index(out_of[0], arr.shape)
            raise InputError(f"{name}: expected integers {rng}; {_at(tuple(map(int, idx)))} is "
                             f"{int(flat[out_of[0]])}")
        return np.array([int(x) for x in flat], dtype=dtype).reshape(arr.shape)
    if arr.dtype.kind == "f":
        arr = arr.astype(np.float64, copy=False)  # exact for f2/f4; compared below as float64 (no overflow)
        finite = np.isfinite(arr)
        if not finite.all():
            idx = _first(~finite)
            raise InputError(f"{name}: expected integers, not NaN or infinite values; {_at(idx)} is "
                             f"{float(arr[idx])!r}")
        whole = arr == np.floor(arr)
        if not whole.all():
            idx = _first(~whole)
            raise InputError(f"{name}: expected integers; {_at(idx)} is {float(arr[idx])!r}")
        # compared as floats, before the cast (which would wrap): float(hi) may round up, so ≥ on it
        outside = (arr < float(lo)) | (arr > float(hi)) | (arr >= float(info.max))
        if outside.any():
            idx = _first(outside)
            raise InputError(f"{name}: expected integers {rng}; {_at(idx)} is {float(arr[idx])!r}")
        return arr.astype(dtype)
    if arr.dtype.kind not in "iu":
        shown_value = shown(value) if not isinstance(value, np.ndarray) else shown(value.ravel()[:4].tolist())
        raise InputError(f"{name}: expected integers, got dtype {arr.dtype} ({shown_value})")
    if arr.size:
        amin, amax = int(arr.min()), int(arr.max())
        if amin < lo or amax > hi:
            idx = _first(arr < lo) if amin < lo else _first(arr > hi)
            raise InputError(f"{name}: expected integers {rng}; {_at(idx)} is {int(arr[idx])}")
    return arr.astype(dtype, copy=False)


def check_redundant_experts(value, name: str = "redundant_experts") -> int:
    """Redundant expert slots per MoE layer: an integer ≥ 0 (whether E + N fits the EP size is
    :meth:`~routepack_opt.core.topology.Topology.check_experts`'s question)."""
    if not is_integer(value) or value < 0:
        raise InputError(f"{name}: expected an integer ≥ 0, got {shown(value)}")
    return int(value)


def check_positive_int(value, name: str, *, allow_none: bool = False) -> int | None:
    """An integer ≥ 1 (numpy integers too, never a bool or a float such as 2.0); None passes
    only with ``allow_none``."""
    if value is None and allow_none:
        return None
    if not is_integer(value) or value < 1:
        raise InputError(f"{name}: expected a positive integer{' or None' if allow_none else ''}, got {shown(value)}")
    return int(value)


def check_known_options(given, known, where: str) -> None:
    """Raise naming every key of ``given`` not in ``known`` (with the nearest known spelling),
    instead of Python's ``TypeError: ... got an unexpected keyword argument``."""
    import difflib

    unknown = sorted(set(given) - set(known))
    if not unknown:
        return
    parts = []
    for key in unknown:
        near = difflib.get_close_matches(str(key), [str(k) for k in known], n=1)
        parts.append(f"{key!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    raise InputError(f"{where}: unknown option{'s' if len(unknown) > 1 else ''} {', '.join(parts)}; "
                     f"known: {', '.join(sorted(known))}")
