"""The RL frameworks' own packers, at the row count each framework picks (docs/cli.md, ``replay-report``).

Legend: N samples, D DP slots, R rows (micro-batches per slot), C token cap, B bins.

:mod:`.baselines` packs at a given R (R*, so that searched plans are compared at equal rows);
here each framework picks its own R, as it does in training, so a baseline may use more rows
than R* (``extra rows``) or break the cap (``cap violations``). Every function returns
``(row_N, slot_N, R)``; cells may be over the cap only where the framework allows it. Written
from the frameworks' documented rules, on RoutePack's kernels (KK, FFD), except verl's where verl is
installed (below).

- ``verl`` (verl 0.9.1): ``RayPPOTrainer._balance_batch`` splits the batch over the D ranks by
  Karmarkar–Karp on verl's workload ``24576·s + s²`` with equal sizes (the estimate: on tokens); each rank's
  ``rearrange_micro_batches`` starts at ``min(n_d, ceil(tokens_d / C))`` micro-batches, agreed
  across ranks (all-reduce MAX), partitions the workload by KK (unequal sizes), and adds a
  micro-batch on every rank until every micro-batch of every rank fits C. Micro-batches are then
  ordered by decreasing workload and interleaved (small ones at both ends). With ``own=True`` (the
  verl seams: :mod:`routepack_opt.integrations.verl_balance`) this is verl's own code, run
  (:func:`verl_rank_micro_batches`: its ``get_seqlen_balanced_partitions``,
  ``calculate_workload`` and ``rearrange_micro_batches``, the ranks' all-reduces replayed by
  calling it per rank until the counts agree); otherwise (the planner's baseline check, so that a
  plan never depends on whether verl is imported; or where verl's pure-Python KK would take too
  long, :data:`VERL_OWN_MAX_WORK`) the same rule on RoutePack's compiled KK, an estimate (its DP
  split on tokens where verl's is on the workload; ties may break differently).
- ``verl-target``: the same without the hard-limit loop (verl releases before it; the cap is a
  target, so micro-batches may exceed C).
- ``nemo-ffd`` / ``nemo-mffd`` (NeMo-RL sequence packing): first-fit decreasing, or Johnson &
  Garey's modified FFD (1985), into bins of C; the bin count is raised to a multiple of D by
  splitting the heaviest bins; R = bins / D bins per rank, dealt balancing tokens.
- ``slime`` (``build_dp_schedule`` with ``balance_data``): one first-fit pass in sample order
  into bins of C, bins split until their count is a multiple of D, dealt to ranks by KK with
  equal sizes (slime balances estimated FLOPs; tokens here).

Row rules of the topology (``min_rows``, ``row_multiple``) are applied the way each framework
applies them (verl's ``min_num_micro_batch`` / ``num_batches_divided_by``).
"""

from __future__ import annotations

import bisect
import importlib
import sys
from collections.abc import Callable

import numpy as np

from routepack_opt.core.errors import InfeasibleError, InputError
from routepack_opt.core.topology import Topology
from routepack_opt.heuristics.baselines import _deal, _split_until
from routepack_opt.heuristics.binpack import first_fit_decreasing
from routepack_opt.heuristics.cells import check_lengths, kk_partition

__all__ = ["verl_layout", "verl_target_layout", "verl_rank_micro_batches", "verl_seqlen_balancing",
           "VERL_OWN_MAX_WORK", "nemo_layout", "slime_layout", "modified_first_fit_decreasing",
           "first_fit", "cap_violations", "FRAMEWORK_PACKERS"]


def _lengths(lengths, topology: Topology) -> np.ndarray:
    return check_lengths(lengths, topology.capacity)


def _round_rows(R: int, topology: Topology) -> int:
    R = max(R, topology.min_rows)
    m = topology.row_multiple
    return -(-R // m) * m


def cap_violations(lengths, row_N, slot_N, rows: int, dp: int, capacity: int) -> int:
    """Number of cells (micro-batches) holding more than ``capacity`` tokens."""
    cell = np.asarray(row_N, dtype=np.int64) * dp + np.asarray(slot_N, dtype=np.int64)
    tokens = np.bincount(cell, weights=np.asarray(lengths, dtype=np.float64), minlength=rows * dp)
    return int((tokens > capacity).sum())


# ------------------------------------------------------------------ verl


def _verl_order(work_N: np.ndarray, part_n: np.ndarray, idx: np.ndarray, K: int) -> np.ndarray:
    """verl's micro-batch order inside a rank: by decreasing workload (ties: lower first sample
    first), then the even positions reversed followed by the odd ones. Returns the row of each
    of the rank's samples."""
    work_K = np.bincount(part_n, weights=work_N[idx], minlength=K)
    first_K = np.full(K, np.iinfo(np.int64).max)
    np.minimum.at(first_K, part_n, idx)
    order = sorted(range(K), key=lambda k: (work_K[k], first_K[k]), reverse=True)
    order = order[::2][::-1] + order[1::2]
    row_K = np.empty(K, dtype=np.int64)
    row_K[np.asarray(order, dtype=np.int64)] = np.arange(K)
    return row_K[part_n]


# verl's KK is pure Python and superlinear in items × parts (one rank of 128 samples into 39
# micro-batches: 80 ms; 512 into 148: 12 s, a loaded 2-core machine): above this many
# items × parts per call the compiled estimate stands in for it (and says so)
VERL_OWN_MAX_WORK = 6_000


def verl_seqlen_balancing(import_it: bool = False):
    """verl's ``verl.utils.seqlen_balancing`` module where this process has imported verl (a verl
    trainer or worker; ``import_it``: import it here), else None. The planner does not import verl
    itself: ``import verl`` takes seconds (12 s on a loaded 2-core machine), more than a time limit."""
    name = "verl.utils.seqlen_balancing"
    if not import_it and name not in sys.modules:
        return None
    try:
        module = importlib.import_module(name)
    except Exception:  # noqa: BLE001 - any import failure means: no verl to run
        return None
    return module


def _own_rearrange(module, rearrange):
    """verl's own ``rearrange_micro_batches`` (``rearrange`` when given), or None where the module's
    one is RoutePack's drop-in (the plugin patched it and did not say what it replaced)."""
    fn = rearrange if rearrange is not None else getattr(module, "rearrange_micro_batches", None)
    return None if fn is None or getattr(fn, "__routepack__", False) else fn


def _verl_workload(len_N: np.ndarray) -> np.ndarray:
    return 24576.0 * len_N + len_N.astype(np.float64) ** 2  # verl's calculate_workload


def _estimate_rank_parts(len_n: np.ndarray, K: int) -> list[list[int]]:
    """One rank's micro-batches at count K by verl's rule on RoutePack's compiled KK, in verl's run order."""
    idx = np.arange(len_n.size)
    part = kk_partition(_verl_workload(len_n), K, equal_size=False)
    row = _verl_order(_verl_workload(len_n), part, idx, K)
    return [np.flatnonzero(row == r).tolist() for r in range(K)]


def verl_rank_micro_batches(len_per_rank: list, capacity: int, *, min_rows: int = 1, row_multiple: int = 1,
                            use_dynamic_bsz_balance: bool = True, rearrange=None,
                            use_verl: bool = True) -> tuple[list[list[list[int]]], str]:
    """The micro-batches verl's ``rearrange_micro_batches`` gives each DP rank of one mini-batch
    (``len_per_rank[d]``: rank d's sample lengths in its order), with the ranks' all-reduces
    (the count's MAX, the fit's MIN) replayed: each rank is called at the agreed count (its
    ``min_num_micro_batch``) until every rank returns that count, which is the least count
    ≥ verl's start at which every rank fits, as verl's synchronized loop finds it. Returns
    (``[d][j]``: rank d's j-th micro-batch, indices into ``len_per_rank[d]``, in verl's run order;
    the source: ``"verl"`` when verl's own function ran, else ``"estimate: why"``).
    ``rearrange``: verl's own function (default: the installed module's, unless it is patched)."""
    lens = [np.asarray(x, dtype=np.int64).reshape(-1) for x in len_per_rank]
    C, m = int(capacity), max(1, int(row_multiple))
    module = None if not use_verl else rearrange if rearrange is not None else verl_seqlen_balancing(import_it=True)
    fn = None if module is None else _own_rearrange(module, rearrange)
    start = max(max(min(x.size, -(-int(x.sum()) // C)) for x in lens), int(min_rows))
    start = -(-start // m) * m
    why = ("asked for the estimate" if not use_verl else "verl is not installed" if module is None
           else "verl's rearrange_micro_batches is RoutePack's drop-in" if fn is None else "")
    if fn is not None and max(x.size for x in lens) * start > VERL_OWN_MAX_WORK:
        fn, why = None, f"verl's pure-Python KK on {max(x.size for x in lens)} samples per rank would take too long"
    if fn is None:
        K = start
        while True:
            if K > min(x.size for x in lens):
                raise InfeasibleError(f"verl needs {K} micro-batches per rank but a rank holds "
                                      f"{min(x.size for x in lens)} samples")
            parts = [_estimate_rank_parts(x, K) for x in lens]
            if all(sum(int(x[i]) for i in p) <= C for x, ps in zip(lens, parts) for p in ps):
                return parts, f"estimate: {why}"
            K += m
    import torch
    from tensordict import TensorDict

    # verl reads only the lengths (attention_mask's row sums) and the padded width (here 1 ≤ C)
    tds = [TensorDict({"attention_mask": torch.from_numpy(x[:, None]), "input_ids": torch.from_numpy(x[:, None])},
                      batch_size=[x.size]) for x in lens]
    K = start
    got: list = [None] * len(tds)
    while True:
        for d, td in enumerate(tds):
            if got[d] is not None and len(got[d]) == K:  # verl's KK at this count already ran on rank d
                continue
            try:
                got[d] = fn(td, C, dp_group=None, num_batches_divided_by=m if m > 1 else None,
                            min_num_micro_batch=K, use_dynamic_bsz_balance=use_dynamic_bsz_balance)[1]
            except ValueError as exc:
                raise InfeasibleError(f"verl's rearrange_micro_batches: {exc}") from None
        K_new = max(len(p) for p in got)
        if K_new == K and all(len(p) == K for p in got):
            return [[list(map(int, p)) for p in ps] for ps in got], "verl"
        K = K_new


def _verl(lengths, topology: Topology, hard_limit: bool) -> tuple[np.ndarray, np.ndarray, int]:
    len_N = _lengths(lengths, topology)
    D, C = topology.dp, topology.capacity
    N = len_N.size
    if N < D:
        raise InfeasibleError(f"{N} samples cannot fill {D} DP ranks")
    slot_N = kk_partition(len_N.astype(np.float64), D, equal_size=True)
    members = [np.flatnonzero(slot_N == d) for d in range(D)]
    n_min = min(m.size for m in members)
    K = max(min(m.size, -(-int(len_N[m].sum()) // C)) for m in members)  # all-reduce MAX
    K = max(K, topology.min_rows)
    m_rows = topology.row_multiple
    K = -(-K // m_rows) * m_rows  # num_batches_divided_by
    work_N = _verl_workload(len_N)
    while True:  # (the DP split above is on tokens: the planner's golden records were made so)
        if K > n_min:
            raise InfeasibleError(f"verl needs {K} micro-batches per rank but a rank holds {n_min} samples")
        parts = [kk_partition(work_N[m], K, equal_size=False) for m in members]
        fits = all((np.bincount(p, weights=len_N[m], minlength=K) <= C).all() for p, m in zip(parts, members))
        if fits or not hard_limit:
            break
        K += m_rows
    row_N = np.empty(N, dtype=np.int64)
    for p, m in zip(parts, members):
        row_N[m] = _verl_order(work_N, p, m, K)
    return row_N, slot_N, K


def verl_layout(lengths, topology: Topology, *, own: bool = False) -> tuple[np.ndarray, np.ndarray, int]:
    """verl 0.9.1 (one mini-batch): DP split by equal-size KK, then per rank
    ``rearrange_micro_batches`` at the agreed count, raised until every micro-batch fits the cap
    (module docstring). ``own``: verl's own functions (``get_seqlen_balanced_partitions`` on its
    workload, :func:`verl_rank_micro_batches`), where verl can be imported; default (and without
    verl) the estimate on RoutePack's compiled KK, which splits the ranks on tokens. The planner
    (``FRAMEWORK_PACKERS``: the baseline check, ``replay-report``) keeps the estimate, so that a
    plan never depends on whether the process has imported verl."""
    module = verl_seqlen_balancing(import_it=True) if own else None
    if module is None:
        return _verl(lengths, topology, hard_limit=True)
    len_N = _lengths(lengths, topology)
    D = topology.dp
    if len_N.size < D:
        raise InfeasibleError(f"{len_N.size} samples cannot fill {D} DP ranks")
    import torch

    work = module.calculate_workload(torch.from_numpy(len_N)).tolist()
    try:
        members = [np.asarray(p, dtype=np.int64) for p in
                   module.get_seqlen_balanced_partitions(work, k_partitions=D, equal_size=len_N.size % D == 0)]
    except AssertionError as exc:
        raise InfeasibleError(f"verl's get_seqlen_balanced_partitions: {exc}") from None
    parts, _ = verl_rank_micro_batches([len_N[m] for m in members], topology.capacity, min_rows=topology.min_rows,
                                       row_multiple=topology.row_multiple)
    row_N = np.empty(len_N.size, dtype=np.int64)
    slot_N = np.empty(len_N.size, dtype=np.int64)
    for d, (m, ps) in enumerate(zip(members, parts)):
        slot_N[m] = d
        for r, p in enumerate(ps):
            row_N[m[p]] = r
    return row_N, slot_N, len(parts[0])


def verl_target_layout(lengths, topology: Topology) -> tuple[np.ndarray, np.ndarray, int]:
    """verl without the hard-limit loop: ``ceil(tokens / C)`` micro-batches (agreed MAX), the cap
    a target only — micro-batches over it are counted by :func:`cap_violations`."""
    return _verl(lengths, topology, hard_limit=False)


# ------------------------------------------------------------------ bin packers


def first_fit(sizes, capacity: int) -> tuple[np.ndarray, int]:
    """First fit in the given order: each item to the lowest-numbered bin with room (new bin if
    none). Returns (bin per item, bins used)."""
    s = np.asarray(sizes, dtype=np.int64)
    room = np.empty(s.size, dtype=np.int64)
    bin_N = np.empty(s.size, dtype=np.int64)
    used = 0
    for i, x in enumerate(s.tolist()):
        fit = np.flatnonzero(room[:used] >= x)
        b = int(fit[0]) if fit.size else used
        if b == used:
            room[used] = capacity
            used += 1
        room[b] -= x
        bin_N[i] = b
    return bin_N, used


def modified_first_fit_decreasing(sizes, capacity: int) -> tuple[np.ndarray, int]:
    """Johnson & Garey's modified first-fit decreasing (1985), in the phases NeMo-RL uses.

    Items are large (> C/2), medium (C/3, C/2], small (C/6, C/3] or tiny (≤ C/6). (1) One bin
    per large item, largest first. (2) Forward over those bins: add the largest medium item that
    fits. (3) Backward over the bins without a medium item: if the two smallest small items fit,
    add the smallest and the largest small item that fits beside it. (4) Forward over all bins:
    repeatedly add the largest remaining item that fits. (5) First-fit decreasing on what is left,
    into new bins. Returns (bin per item, bins used)."""
    s = np.asarray(sizes, dtype=np.int64)
    C = int(capacity)
    order = np.argsort(-s, kind="stable")
    large = [int(i) for i in order if 2 * s[i] > C]
    medium = [int(i) for i in order if 3 * s[i] > C >= 2 * s[i]]  # decreasing
    small = [int(i) for i in order[::-1] if 6 * s[i] > C >= 3 * s[i]]  # increasing
    tiny = [int(i) for i in order[::-1] if C >= 6 * s[i]]
    bins: list[list[int]] = [[i] for i in large]
    room = [C - int(s[i]) for i in large]
    has_medium = [False] * len(bins)
    for b in range(len(bins)):  # (2)
        for j, i in enumerate(medium):
            if s[i] <= room[b]:
                bins[b].append(medium.pop(j))
                room[b] -= int(s[i])
                has_medium[b] = True
                break
    for b in reversed(range(len(bins))):  # (3)
        if has_medium[b] or len(small) < 2 or s[small[0]] + s[small[1]] > room[b]:
            continue
        first = small.pop(0)
        left = room[b] - int(s[first])
        sizes_small = [int(s[i]) for i in small]
        j = bisect.bisect_right(sizes_small, left) - 1  # the largest small that fits beside it
        bins[b] += [first, small.pop(j)]
        room[b] = left - int(s[bins[b][-1]])
    rest = sorted(medium + small + tiny, key=lambda i: (int(s[i]), -i))  # increasing (ties: lower id last)
    rest_sizes = [int(s[i]) for i in rest]
    for b in range(len(bins)):  # (4)
        while rest:
            j = bisect.bisect_right(rest_sizes, room[b]) - 1
            if j < 0:
                break
            room[b] -= rest_sizes.pop(j)
            bins[b].append(rest.pop(j))
    bin_N = np.empty(s.size, dtype=np.int64)
    for b, members in enumerate(bins):
        bin_N[members] = b
    if rest:  # (5)
        idx = np.asarray(rest, dtype=np.int64)
        ffd_N, _ = first_fit_decreasing(s[idx], C)
        bin_N[idx] = len(bins) + ffd_N
    used = int(np.unique(bin_N).size)
    return bin_N, used


def _bins_to_layout(len_N, bin_N, used: int, topology: Topology, deal: str) -> tuple[np.ndarray, np.ndarray, int]:
    D = topology.dp
    R = _round_rows(-(-used // D), topology)
    if R * D > len_N.size:
        raise InfeasibleError(f"{used} bins need {R}×{D} cells but the window has {len_N.size} samples")
    cell_N = _split_until(len_N, bin_N, R * D)
    row_N, slot_N = _deal(len_N, cell_N, R, D, deal)
    return row_N, slot_N, R


def nemo_layout(lengths, topology: Topology, algorithm: str = "ffd") -> tuple[np.ndarray, np.ndarray, int]:
    """NeMo-RL: FFD (``algorithm="ffd"``) or MFFD (``"mffd"``) bins of the cap, their count raised
    to a multiple of D by splitting the heaviest, R = bins / D per rank, dealt balancing tokens."""
    if topology.equal_samples_per_slot:
        raise InfeasibleError("NeMo-RL's packing does not keep equal sample counts per slot")
    len_N = _lengths(lengths, topology)
    if algorithm == "ffd":
        bin_N, used = first_fit_decreasing(len_N, topology.capacity)
    elif algorithm == "mffd":
        bin_N, used = modified_first_fit_decreasing(len_N, topology.capacity)
    else:
        raise InputError(f"algorithm must be 'ffd' or 'mffd', got {algorithm!r}")
    return _bins_to_layout(len_N, bin_N, used, topology, "balanced")


def slime_layout(lengths, topology: Topology) -> tuple[np.ndarray, np.ndarray, int]:
    """slime: first fit in sample order into bins of the cap, split to a multiple of D, dealt to
    ranks by equal-size KK (``balance_data``)."""
    if topology.equal_samples_per_slot:
        raise InfeasibleError("slime's packing does not keep equal sample counts per slot")
    len_N = _lengths(lengths, topology)
    bin_N, used = first_fit(len_N, topology.capacity)
    return _bins_to_layout(len_N, bin_N, used, topology, "kk")


# name → layout(lengths, topology) -> (row_N, slot_N, R)
FRAMEWORK_PACKERS: dict[str, Callable[..., tuple[np.ndarray, np.ndarray, int]]] = {
    "verl": verl_layout,
    "verl-target": verl_target_layout,
    "nemo-ffd": lambda lengths, topology: nemo_layout(lengths, topology, "ffd"),
    "nemo-mffd": lambda lengths, topology: nemo_layout(lengths, topology, "mffd"),
    "slime": slime_layout,
}
