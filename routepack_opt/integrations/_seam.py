"""What every trainer seam shares around its plan: settings (keyword > environment > default,
checked once, errors naming the keyword or the variable), the per-call record, the framework's
exception types, and one warning per cause.

Environment (read when a seam is installed / the verl plugin loads, and on calls that do not pass
the keyword):

- ``ROUTEPACK_COST``: a preset name or a cost TOML (default ``qwen3-30b-a3b``);
- ``ROUTEPACK_OBJECTIVE``: ``max-sum`` or ``sum-max`` (default ``max-sum``);
- ``ROUTEPACK_TIME_LIMIT``: seconds per seam call (per step: verl's ``balance_batch`` and slime's
  ``build_dp_schedule`` per step they plan), or ``none`` for no limit (default
  :data:`DEFAULT_TIME_LIMIT` for the seam). It bounds the whole call: reading the batch and
  importing its routes, every mini-batch's plan (the rest of the budget split evenly over the
  mini-batches left), and applying the plan (reorder, plan columns, record). Where the budget is
  too short for the search, the seam's quick path (a cap-keeping greedy, or the framework's own
  layout, whichever the evaluator scores better) runs, and the record says so (``quick``);
  the search's own floor (R* certification and seeds, tens of ms) can overrun a very short
  budget by that much;
- ``ROUTEPACK_THREADS``: numba threads the planner's kernels use during a seam call, or ``all``
  (default 1: a trainer host's cores are busy, and on a busy machine the parallel kernels' thread
  launches cost more than they save on a seam's small windows, experiments/seam_latency.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import threading
import time
from collections import deque

from routepack_opt.core.checks import check_choice, check_known_options, check_time_limit
from routepack_opt.core.cost import CostModel, resolve_cost
from routepack_opt.core.errors import InputError
from routepack_opt.core.objective import Objective, check_objective

__all__ = ["FrameworkAssertionError", "SeamSettings", "seam_settings", "SeamRecord", "Recorder", "CallBudget",
           "import_skip", "failure_cause", "SETTING_KEYS", "warn_once", "UNSET", "DEFAULT_TIME_LIMIT",
           "SHARE_OF_STEP", "SHARE_OF_GAIN", "OVERLAP_SHARE", "OVERLAP_MAX_S", "DEFAULT_THREADS", "DEFAULT_COST",
           "ENV_VARS"]

logger = logging.getLogger("routepack_opt.integrations")

DEFAULT_COST = "qwen3-30b-a3b"
# Seconds per seam call (pipeline clock: R*, seeds and the search together; numba's first compile
# is off it). verl calls the drop-in on every rank several times a step, so its limit is about
# verl's own time at B = 256 (96 ms in the trainer-seams trial); slime plans each step once on
# the driver, where a step trains for seconds; verl's balance_batch plans the whole global batch
# once per step on the driver. experiments/seam_latency.py measures the per-call ones.
# verl_balance's cap is high because its default budget is SHARE_OF_GAIN of the step's predicted
# gain: at N = 1,024 with routes the route import alone takes 0.2-0.8 s (loaded 2 cores) against a
# predicted gain of seconds, so a 0.5 s cap never let the routes pay (issue 49)
DEFAULT_TIME_LIMIT = {"verl": 0.1, "slime": 0.25, "verl_balance": 2.0}
# verl's overlap modes plan behind the step's log-prob passes: their default budget is this share
# of the last step's time between _balance_batch and the update (less the background import and
# gather), at most OVERLAP_MAX_S per step; OVERLAP_FIRST_S on the first step (no hidden time known)
OVERLAP_SHARE, OVERLAP_MAX_S, OVERLAP_FIRST_S = 0.8, 2.0, 0.5
SHARE_OF_STEP = 0.1  # the default limit's share of the framework layout's predicted step time
# the default budget's share of the step's predicted gain (the framework's layout − the lower
# bound of ours), so that what planning costs stays below what it can save
SHARE_OF_GAIN = 0.5
ENV_VARS = ("ROUTEPACK_COST", "ROUTEPACK_OBJECTIVE", "ROUTEPACK_TIME_LIMIT", "ROUTEPACK_THREADS")
DEFAULT_THREADS = 1


class FrameworkAssertionError(InputError, AssertionError):
    """Where the replaced function asserts, the drop-in raises this: an ``AssertionError`` for the
    framework's callers and tests (``pytest.raises(AssertionError, match=...)``) and an
    :class:`InputError` for RoutePack's (the CLI's ``error:`` line)."""


UNSET = object()


@dataclasses.dataclass(frozen=True)
class SeamSettings:
    """A seam's planner settings, resolved and checked. ``time_limit`` None: unbounded."""

    cost: CostModel
    objective: Objective
    time_limit: float | None
    max_sweeps: int | None = None
    seed: int = 0
    time_limit_is_default: bool = False  # neither keyword nor ROUTEPACK_TIME_LIMIT set it
    threads: int | None = DEFAULT_THREADS  # numba threads during a call (None: numba's own)

    @contextlib.contextmanager
    def planner_threads(self):
        """Run the block with :attr:`threads` numba threads (numba's setting is per calling
        thread; restored after)."""
        if self.threads is None:
            yield
            return
        import numba

        prev = numba.get_num_threads()
        numba.set_num_threads(max(1, min(self.threads, numba.config.NUMBA_NUM_THREADS)))
        try:
            yield
        finally:
            numba.set_num_threads(prev)

    def step_time_limit(self, predicted_us: float | None) -> float | None:
        """The limit for one call whose framework layout is predicted at ``predicted_us``: a set
        limit as it is; the default one at most :data:`SHARE_OF_STEP` of that predicted time (at
        least 10 ms), so planning stays well below what it can save."""
        if not self.time_limit_is_default or self.time_limit is None or predicted_us is None:
            return self.time_limit
        return min(self.time_limit, max(0.01, SHARE_OF_STEP * predicted_us / 1e6))

    def gain_time_limit(self, gain_us: float | None) -> float | None:
        """The whole-call budget of a step that can save at most ``gain_us`` (predicted): a set
        limit as it is; the default one at most :data:`SHARE_OF_GAIN` of that gain."""
        if not self.time_limit_is_default or self.time_limit is None or gain_us is None:
            return self.time_limit
        return min(self.time_limit, max(0.0, SHARE_OF_GAIN * gain_us / 1e6))

    def call_budget(self, predicted_us: float | None = None, gain_us: float | None = None) -> float | None:
        """One seam call's whole budget: :meth:`step_time_limit` of the framework layout's
        predicted time, and with the default limit at most :meth:`gain_time_limit` of the
        predicted gain where one is known (None: unbounded)."""
        budget = self.step_time_limit(predicted_us)
        if gain_us is not None and self.time_limit_is_default:
            by_gain = self.gain_time_limit(gain_us)
            budget = by_gain if budget is None else min(budget, by_gain)
        return budget


@dataclasses.dataclass(frozen=True)
class CallBudget:
    """One seam call's budget on ``time.perf_counter``'s clock: ``total_s`` from ``t0`` (None:
    unbounded). Both seams spend it the same way: what is left goes to the search, and when a
    search's share is under the seam's floor the quick path stands, unless ``max_sweeps`` asks
    for a fixed search effort."""

    settings: SeamSettings
    t0: float
    total_s: float | None

    def left(self, reserve_s: float = 0.0, shares: int = 1) -> float | None:
        """Seconds left for one of ``shares`` equal parts, ``reserve_s`` kept for what follows."""
        if self.total_s is None:
            return None
        return (self.t0 + self.total_s - time.perf_counter() - reserve_s) / shares

    def short(self, left: float | None, min_search_s: float) -> str | None:
        """``"budget: N ms left"`` when ``left`` is under ``min_search_s`` (the quick path stands;
        the seam adds what the budget was for), else None."""
        if left is None or left >= min_search_s or self.settings.max_sweeps is not None:
            return None
        return f"budget: {max(left, 0.0) * 1e3:.0f} ms left"


def import_skip(predicted_s: float, limit_s: float | None, over: str) -> str | None:
    """Why a route import predicted at ``predicted_s`` is skipped (over ``limit_s``, which
    ``over`` names; the step is then planned on lengths), else None."""
    if limit_s is None or predicted_s <= limit_s:
        return None
    return (f"route import: predicted {predicted_s * 1e3:.0f} ms, over {over} ({limit_s * 1e3:.0f} ms); "
            "planned on lengths")


def _check_time_limit(value, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("none", "off"):  # "inf" is refused, as --time-limit inf is
            return None
        try:
            value = float(text)
        except ValueError:
            raise InputError(f"{where}: expected a positive number of seconds or 'none', got {value!r}") from None
    return check_time_limit(value, where)


def _strip_flag(msg: str) -> str:
    return msg.removeprefix("--cost: ")


def _check_threads(value, where: str) -> int | None:
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "all":
            return None
        try:
            value = int(text)
        except ValueError:
            raise InputError(f"{where}: expected a positive integer or 'all', got {value!r}") from None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{where}: expected a positive integer or None, got {value!r}")
    cpus = os.cpu_count() or 1
    if value > cpus:  # numba runs at most one thread per CPU (NUMBA_NUM_THREADS)
        raise InputError(f"{where}: {value} threads, but this machine has {cpus} CPUs; give at most {cpus} or 'all'")
    return value


# the keywords of :func:`seam_settings`, which every seam's install function passes on
SETTING_KEYS = ("cost", "objective", "time_limit", "max_sweeps", "seed", "threads")


def seam_settings(seam: str, *, cost=None, objective=None, time_limit=UNSET, max_sweeps=None,
                  seed: int = 0, threads=UNSET, **unknown) -> SeamSettings:
    """Settings of ``seam`` (a key of :data:`DEFAULT_TIME_LIMIT`: ``"verl"``, ``"slime"``,
    ``"verl_balance"``): each keyword given wins, else its ``ROUTEPACK_*`` variable, else the
    default. A bad value is one :class:`InputError` naming the keyword (``cost=...``) or the
    variable (``ROUTEPACK_COST=...``); so is an unknown seam or a misspelled keyword."""
    check_choice(seam, "seam", DEFAULT_TIME_LIMIT)  # an unknown seam: InputError, never KeyError
    check_known_options(unknown, SETTING_KEYS, "settings")
    env = os.environ
    if cost is None:
        name = env.get("ROUTEPACK_COST", "").strip() or DEFAULT_COST
        try:
            cm = resolve_cost(name)
        except InputError as exc:
            raise InputError(f"ROUTEPACK_COST={name!r}: {_strip_flag(str(exc))}") from None
    elif isinstance(cost, CostModel):
        cm = cost
    else:
        try:
            cm = resolve_cost(cost)
        except InputError as exc:
            raise InputError(f"cost={cost!r}: {_strip_flag(str(exc))}") from None
    if objective is None:
        text = env.get("ROUTEPACK_OBJECTIVE", "").strip() or "max-sum"
        try:
            obj = check_objective(text)
        except InputError as exc:
            raise InputError(f"ROUTEPACK_OBJECTIVE={text!r}: {exc}") from None
    else:
        try:
            obj = check_objective(objective)
        except InputError as exc:
            raise InputError(f"objective={objective!r}: {exc}") from None
    default = False
    if time_limit is UNSET:
        text = env.get("ROUTEPACK_TIME_LIMIT", "").strip()
        tl = _check_time_limit(text, f"ROUTEPACK_TIME_LIMIT={text!r}") if text else DEFAULT_TIME_LIMIT[seam]
        default = not text
    else:
        tl = _check_time_limit(time_limit, "time_limit")
    if max_sweeps is not None and (isinstance(max_sweeps, bool) or not isinstance(max_sweeps, int)
                                   or max_sweeps < 1):
        raise InputError(f"max_sweeps: expected a positive integer or None, got {max_sweeps!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InputError(f"seed: expected an integer, got {seed!r}")
    if threads is UNSET:
        text = env.get("ROUTEPACK_THREADS", "").strip()
        nt = _check_threads(text, f"ROUTEPACK_THREADS={text!r}") if text else DEFAULT_THREADS
    else:
        nt = _check_threads(threads, "threads")
    return SeamSettings(cm, str(obj.value), tl, max_sweeps, seed, default, nt)


@dataclasses.dataclass(frozen=True)
class SeamRecord:
    """One seam call: ours against the framework's own function on the same input.

    Times in µs are the evaluator's predicted step time (makespan under ``objective``) of the
    call's samples; ``theirs`` is the framework's own packing (verl's KK; slime's first-fit and
    round-robin / KK, with the identity expert placement), scored by the same evaluator.
    ``saving_us`` = theirs − ours; ``net_saving_us`` subtracts the planning time when the call is
    on the critical path (``on_critical_path``). ``fallback``: why the framework's own result was
    used (None when ours was). ``source``: ``"plan"`` when the call planned, ``"driver"`` when it
    returned micro-batches planned upstream (verl: the driver's ``balance_batch``) without planning."""

    seam: str
    rows: int
    rows_theirs: int | None
    predicted_us: float | None
    predicted_us_theirs: float | None
    planning_s: float
    theirs_s: float | None = None
    samples: int = 0
    on_critical_path: bool = True
    fallback: str | None = None
    step: int | None = None
    source: str = "plan"  # "plan": planned in this call; "driver": the driver's plan, looked up
    # the call's wall time split: reading the input (lengths, route import), planning (every
    # mini-batch or step, the framework's reference included), applying (reorder, columns, record)
    import_s: float | None = None
    plan_s: float | None = None
    apply_s: float | None = None
    budget_s: float | None = None  # the call's whole budget (None: unbounded)
    quick: str | None = None  # why the quick path ran instead of the search (None: it did not)
    redundant_experts: int = 0
    # wall time the call added over the framework's own (None: planning_s, all of it); with
    # ``on_critical_path`` False only what training waited for
    added_s: float | None = None
    # the part of the predicted times spent in the forward-only passes that reuse the DP split
    # (verl: old log-prob, reference, value), ours and the framework's (None: not modelled)
    forward_us: float | None = None
    forward_us_theirs: float | None = None
    applied: str | None = None  # whose layout the call applied ("routepack" or the framework's name)
    theirs_source: str | None = None  # where "theirs" came from: the framework's own code, or "estimate: why"
    warmup_s: float | None = None  # compiling / loading before the call's clock started (not in added_s)

    @property
    def saving_us(self) -> float | None:
        if self.predicted_us is None or self.predicted_us_theirs is None:
            return None
        return self.predicted_us_theirs - self.predicted_us

    @property
    def net_saving_us(self) -> float | None:
        s = self.saving_us
        if s is None:
            return None
        if self.added_s is not None:
            return s - 1e6 * self.added_s
        return s - (1e6 * self.planning_s if self.on_critical_path else 0.0)

    def metrics(self, prefix: str = "routepack") -> dict[str, float]:
        """A flat ``{prefix}/<name>: number`` dict (numbers only, so it merges into verl's
        ``metrics`` and its reducers / wandb): rows, rows_theirs, predicted_ms, predicted_ms_theirs,
        saving_ms, net_saving_ms, planning_ms, samples, fallback (0/1), driver_plan (1: ``source`` is
        ``"driver"``), import_ms / plan_ms / apply_ms (the wall time's split), budget_ms, added_ms,
        quick (1: the quick path ran, :attr:`quick` says why), redundant_experts, forward_ms /
        forward_ms_theirs (the forward-only passes' share of predicted_ms / predicted_ms_theirs),
        applied_theirs (1: the framework's own layout was applied), theirs_estimate (1: "theirs" is
        an estimate, not the framework's code run), warmup_ms (before the clock). Unknown values
        are left out."""
        vals = {"rows": self.rows, "rows_theirs": self.rows_theirs,
                "predicted_ms": None if self.predicted_us is None else self.predicted_us / 1e3,
                "predicted_ms_theirs": None if self.predicted_us_theirs is None else self.predicted_us_theirs / 1e3,
                "saving_ms": None if self.saving_us is None else self.saving_us / 1e3,
                "net_saving_ms": None if self.net_saving_us is None else self.net_saving_us / 1e3,
                "planning_ms": 1e3 * self.planning_s, "samples": self.samples,
                "fallback": float(self.fallback is not None), "driver_plan": float(self.source == "driver"),
                "import_ms": _ms(self.import_s), "plan_ms": _ms(self.plan_s), "apply_ms": _ms(self.apply_s),
                "budget_ms": _ms(self.budget_s), "added_ms": _ms(self.added_s),
                "quick": float(self.quick is not None), "redundant_experts": self.redundant_experts,
                "forward_ms": _ms(None if self.forward_us is None else self.forward_us / 1e6),
                "forward_ms_theirs": _ms(None if self.forward_us_theirs is None else self.forward_us_theirs / 1e6),
                "applied_theirs": None if self.applied is None else float(self.applied != "routepack"),
                "theirs_estimate": None if self.theirs_source is None else float("estimate" in self.theirs_source),
                "warmup_ms": _ms(self.warmup_s)}
        return {f"{prefix}/{k}": float(v) for k, v in vals.items() if v is not None}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1e3 * seconds


class Recorder:
    """The last records of one seam in this process (thread-safe, bounded)."""

    def __init__(self, maxlen: int = 1024):
        self._records: deque[SeamRecord] = deque(maxlen=maxlen)
        self._lock = threading.Lock()

    def add(self, record: SeamRecord, callback=None) -> SeamRecord:
        with self._lock:
            self._records.append(record)
        if callback is not None:
            callback(record)
        return record

    def last(self) -> SeamRecord | None:
        with self._lock:
            return self._records[-1] if self._records else None

    def pop_all(self) -> list[SeamRecord]:
        with self._lock:
            out = list(self._records)
            self._records.clear()
        return out


_warned: set[tuple[str, str]] = set()
_warn_lock = threading.Lock()


def failure_cause(exc: BaseException) -> str:
    """A failure's cause for :func:`warn_once`: its type and its message with the numbers masked,
    so that each kind of failure warns once (not once per sample id or step, nor only the first
    kind of all)."""
    return f"{exc.__class__.__name__}: {re.sub(r'[0-9]+', '#', str(exc))[:200]}"


def warn_once(seam: str, cause: str, message: str) -> None:
    """Log ``message`` at WARNING the first time ``(seam, cause)`` is seen in this process."""
    with _warn_lock:
        if (seam, cause) in _warned:
            return
        _warned.add((seam, cause))
    logger.warning("routepack %s: %s", seam, message)
