"""Re-placing experts changes nothing: train a tiny MoE model, re-place its experts mid-run, and
compare with a run that never re-places (``routepack verify-runtime``).

Both runs start from the same logical model (initialization is keyed by logical expert id) and
see the same packed micro-batches with the same replayed routes. The re-placed run materializes a
new placement after ``replace_after`` optimizer steps (weights, gradients and Adam state move).
Compared: every micro-batch loss, every dense parameter, and every logical expert's weights,
gradients and Adam moments at the end. With deterministic settings on CPU in float32 they are
bitwise equal (see :mod:`routepack_opt.runtime.moe` for why).

Replicas (``redundant`` > 0, docs/pipeline.md, step 5): three runs on the same data. The
*reference* has one holder per expert. The *replicated* run starts from placement A (the hottest
experts replicated: ``cfg.placer``'s placement of the window's loads, a planner's, passed in)
and after ``replace_after`` steps
migrates to B, a different replica set (new replicas copy weights, grads and Adam state from a
holder; dropped ones are overwritten). It equals the reference within float32 reassociation
(replica partial gradients are summed: :mod:`routepack_opt.runtime.replicas`). The *moved* run
migrates from A to B', B with its slots shuffled (same replica counts, replicas on other slots and
ranks): it equals the replicated run bit for bit, since the summation order depends only on the
replica counts. Every copy of an expert must hold identical bits throughout.

Modes: one process holding all E slots (the D DP slots of the plan run one after another, with
gradient accumulation), and ``world_size`` gloo processes (D = world_size DP ranks, EP groups of P
ranks, real all-to-all token dispatch, ordered all-reduce of gradients).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from routepack_opt.core.checks import (
    INT64_MAX,
    check_bool,
    check_int,
    check_number,
    check_redundant_experts,
    check_time_limit,
    check_type,
    shown,
)
from routepack_opt.core.errors import InputError
from routepack_opt.core.placement import Placement
from routepack_opt.core.plan import Plan
from routepack_opt.core.testing import random_layout, random_window
from routepack_opt.core.topology import Topology
from routepack_opt.runtime.batches import build_microbatches, routes_from_counts, synthetic_tokens
from routepack_opt.runtime.dist import ParallelGroups, deterministic, init_group, launch, ordered_all_reduce
from routepack_opt.runtime.materialize import materialize
from routepack_opt.runtime.model import TinyMoE, TinyMoEConfig, logical_expert_tensors
from routepack_opt.runtime.replicas import replica_max_diff, sum_replica_grads

__all__ = ["VerifyConfig", "RunResult", "verify_runtime", "run_single", "run_distributed",
           "compare_runs", "make_setup", "REPLICA_TOL"]

# replicated vs one holder: float32 reassociation of k partial gradient sums, amplified by Adam's
# normalisation m/√v where a gradient is near 0 (an update is ±lr whatever the gradient's size):
# measured ≤ 1.3e-4 on the weights after 3 steps at lr 1e-2, ≤ 1.2e-7 on the moments. The bound is
# a tenth of one update (lr/10). In float64 the same pair differs by ≤ 2e-13 (REPLICA_TOL_FLOAT64
# 1e-9), while a wrong split or a missed replica sum differs by ~lr in either precision
REPLICA_TOL = 1e-3
REPLICA_TOL_FLOAT64 = 1e-9


@dataclasses.dataclass(frozen=True)
class VerifyConfig:
    """The verification run. ``dp`` DP slots (= processes in the distributed mode), EP size ``ep``."""

    model: TinyMoEConfig = TinyMoEConfig()
    num_samples: int = 24
    max_len: int = 10
    dp: int = 4
    ep: int = 2
    rows: int = 2
    steps: int = 3
    replace_after: int = 1  # materialize the new placement after this many optimizer steps
    lr: float = 1e-2
    seed: int = 0
    timeout_s: float = 120.0  # whole distributed run, processes included
    start_method: str = "forkserver"  # or "spawn" (see routepack_opt.runtime.dist.launch)
    device: str = "cpu"  # "cuda": one GPU per rank, nccl (bitwise equality is only claimed on CPU)
    redundant: int = 0  # redundant expert slots per layer: the replica check (module doc)
    # redundant > 0: placer(load_LE, redundant, ep) -> the replicated Placement of those loads (a
    # planner's; runtime plans nothing: `routepack verify-runtime` passes
    # cli.verify_runtime.replica_check_placement). A module-level function: every process gets it.
    placer: Callable[[np.ndarray, int, int], Placement] | None = None

    def __post_init__(self):
        check_type(self.model, "model", TinyMoEConfig)
        for key in ("dp", "ep", "rows", "steps", "num_samples", "replace_after"):
            check_int(getattr(self, key), key, None, INT64_MAX)  # ≥ 1: below, in verify-runtime's words
        check_type(self.device, "device", str)  # which names: below
        check_type(self.start_method, "start_method", str)
        check_int(self.max_len, "max_len", 2, INT64_MAX)
        check_int(self.seed, "seed", 0, INT64_MAX)
        check_number(self.lr, "lr", 0.0, lo_open=True)
        check_time_limit(self.timeout_s, "timeout_s")
        if self.placer is not None and not callable(self.placer):
            raise InputError(f"placer: expected a callable or None, got {type(self.placer).__name__} "
                             f"{shown(self.placer, 40)}")
        E = self.model.num_experts
        for key in ("dp", "ep", "rows", "steps", "num_samples"):
            if getattr(self, key) < 1:
                raise InputError(f"verify-runtime: {key} must be ≥ 1, got {getattr(self, key)}")
        if self.dp % self.ep:
            raise InputError(f"verify-runtime: world size {self.dp} is not divisible by ep={self.ep}")
        if E % self.ep:
            raise InputError(f"verify-runtime: E={E} experts is not divisible by ep={self.ep}")
        if self.num_samples < int(self.rows) * int(self.dp):
            raise InputError(f"verify-runtime: {self.num_samples} samples cannot fill "
                             f"{self.rows}×{self.dp} cells")
        if self.device not in ("cpu", "cuda"):
            raise InputError(f"verify-runtime: device must be cpu or cuda, got {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise InputError("--device cuda: CUDA is not available on this machine")
        if self.start_method not in ("forkserver", "spawn"):
            raise InputError(f"verify-runtime: start_method must be forkserver or spawn, got {self.start_method!r}")
        if not 1 <= self.replace_after < self.steps:
            raise InputError("verify-runtime: need 1 ≤ replace_after < steps")
        R = check_redundant_experts(self.redundant, "--redundant-experts")
        if R and (E + R) % self.ep:
            raise InputError(f"--redundant-experts {R}: E={E} + {R} = {E + R} slots is not divisible "
                             f"by ep={self.ep}; choose N with ({E} + N) % {self.ep} == 0")
        if R > E * max(self.ep - 1, 1):
            raise InputError(f"--redundant-experts {R}: at most {E * max(self.ep - 1, 1)} with E={E}, "
                             f"ep={self.ep} (every replica of an expert on its own rank)")
        if R and self.placer is None:
            raise InputError("verify-runtime: the replica check needs placer= (the replicated placement "
                             "of a window's loads; e.g. cli.verify_runtime.replica_check_placement)")


@dataclasses.dataclass
class Setup:
    window: object
    plan: Plan
    routes_TLK: np.ndarray
    tokens_per_step: list[np.ndarray]
    new_placement: Placement  # the permutation materialized after replace_after steps (no replicas)
    denom: float  # target tokens of the window: loss = Σ token CE / denom
    replicas: dict | None = None  # redundant > 0: Placements "start" (A), "new" (B), "moved" (B')


def make_setup(cfg: VerifyConfig) -> Setup:
    """Window, plan (random valid layout, identity placement), replayed routes, tokens and the new
    placement — a pure function of the config, so every process derives the same."""
    check_type(cfg, "cfg", VerifyConfig)
    m = cfg.model
    window = random_window(cfg.num_samples, m.num_layers, m.num_experts, m.top_k, cfg.max_len,
                           seed=cfg.seed, min_len=2)
    rng = np.random.default_rng(cfg.seed)
    row, slot = random_layout(window.num_samples, cfg.rows, cfg.dp, rng)
    topo = Topology(dp=cfg.dp, ep=cfg.ep, capacity=window.total_tokens)
    ident = np.tile(np.arange(m.num_experts), (m.num_layers, 1))
    plan = Plan(topology=topo, rows=cfg.rows, placement=ident, row=row, slot=slot)
    new_pl = np.stack([rng.permutation(m.num_experts) for _ in range(m.num_layers)])
    tokens = [synthetic_tokens(window, m.vocab, seed=cfg.seed + 1 + s) for s in range(cfg.steps)]
    replicas = None
    if cfg.redundant:
        load = window.expert_loads().astype(np.float64)
        start = cfg.placer(load, cfg.redundant, cfg.ep)
        # the next window's loads: the hot set shifts (a replica-set change)
        other = random_window(cfg.num_samples, m.num_layers, m.num_experts, m.top_k, cfg.max_len,
                              seed=cfg.seed + 1000, min_len=2).expert_loads().astype(np.float64)
        new = cfg.placer(other, cfg.redundant, cfg.ep)
        if np.array_equal(new.logcnt, start.logcnt):  # force a change: reverse the hotness
            new = cfg.placer(load[:, ::-1].copy(), cfg.redundant, cfg.ep)
        perm = np.stack([rng.permutation(new.num_slots) for _ in range(m.num_layers)])
        moved = Placement(np.take_along_axis(new.phy2log, perm, axis=1), cfg.ep, m.num_experts)
        replicas = {"start": start, "new": new, "moved": moved}
    return Setup(window, plan, routes_from_counts(window, seed=cfg.seed), tokens,
                 Placement.from_permutation(new_pl, cfg.ep),
                 float((window.lengths - 1).sum()), replicas)


@dataclasses.dataclass
class RunResult:
    """What a run produced: ``losses[step]`` = list of micro-batch losses (in a fixed order),
    dense parameters by name, and per (layer, logical expert) its tensors (weights, grads, Adam
    moments) at the end of the last step."""

    losses: list[list[float]]
    dense: dict[str, torch.Tensor]
    experts: dict[tuple[int, int], dict[str, torch.Tensor]]
    move: dict | None = None
    # the same, right after the step boundary where the re-placed run materializes (grads and
    # Adam state still present): the moved state itself, before later steps use it
    boundary: dict[tuple[int, int], dict[str, torch.Tensor]] | None = None
    # largest difference between two copies of one expert on this rank, over every step
    local_replica_diff: float = 0.0
    # bytes this rank sent to sum replica gradients, per step
    replica_grad_bytes: list[int] = dataclasses.field(default_factory=list)


def _optimizer(model: TinyMoE, lr: float):
    # foreach=False: the plain per-tensor loop, elementwise, identical for every slot
    return torch.optim.Adam(model.parameters(), lr=lr, foreach=False)


def _runs(cfg: VerifyConfig, setup: Setup) -> dict[str, tuple]:
    """Name → (starting placement or None, placement materialized after ``replace_after`` steps
    or None), in run order; the first is the reference."""
    if setup.replicas is None:
        return {"reference": (None, None, torch.float32),
                "replaced": (None, setup.new_placement, torch.float32)}
    r = setup.replicas
    f32, f64 = torch.float32, torch.float64
    return {"reference": (None, None, f32), "replicated": (r["start"], r["new"], f32),
            "moved": (r["start"], r["moved"], f32),
            # the same pair in float64: the difference must vanish with the rounding
            "reference64": (None, None, f64), "replicated64": (r["start"], r["new"], f64)}


def _for_ep(pl: Placement | None, ep: int) -> Placement | None:
    """A Placement re-stated for ``ep`` ranks (one process holds all slots: ep = 1)."""
    return pl if pl is None or pl.ep == ep else Placement(pl.phy2log, ep, pl.num_experts)


def run_single(cfg: VerifyConfig, replace: bool, setup: Setup | None = None, start=None,
               new=None, dtype=torch.float32) -> RunResult:
    """One process, all slots local; the plan's D slots run in turn (gradient accumulation).
    ``replace`` (without ``new``): materialize ``setup.new_placement``; ``start`` / ``new``:
    the starting placement and the one materialized after ``replace_after`` steps. DP slot d
    dispatches as source rank d mod ep, as it would in the EP run."""
    check_type(cfg, "cfg", VerifyConfig)
    check_bool(replace, "replace")
    if setup is not None:
        check_type(setup, "setup", Setup)
    for arg, name in ((start, "start"), (new, "new")):
        if arg is not None:
            check_type(arg, name, Placement)
    check_type(dtype, "dtype", torch.dtype)
    setup = setup or make_setup(cfg)
    if replace and new is None:
        new = setup.new_placement
    dev = torch.device(cfg.device)
    with deterministic(cfg.seed):
        model = TinyMoE(cfg.model, phy2log_LS=None if start is None else start.phy2log).to(dev, dtype)
        opt = _optimizer(model, cfg.lr)
        losses, move, boundary, rep_diff, rep_bytes = [], None, None, 0.0, []
        for step in range(cfg.steps):
            batches = [build_microbatches(setup.plan, setup.window, d, setup.tokens_per_step[step],
                                          setup.routes_TLK, device=dev) for d in range(cfg.dp)]
            step_losses = [[0.0] * cfg.rows for _ in range(cfg.dp)]
            for r in range(cfg.rows):  # row by row, as the slots would run them
                for d in range(cfg.dp):
                    for m in model.moe_layers:
                        m.source_rank = d % cfg.ep
                    loss = model.loss_sum(batches[d].microbatches[r]) / setup.denom
                    loss.backward()
                    step_losses[d][r] = float(loss.detach())
            losses.append([x for per_slot in step_losses for x in per_slot])  # slot-major
            rep_bytes.append(sum_replica_grads(model.moe_layers))
            opt.step()
            rep_diff = max(rep_diff, replica_max_diff(model.moe_layers, opt))
            if new is not None and step + 1 == cfg.replace_after:
                # at the step boundary, with gradients still present: they move too
                move = materialize(model.moe_layers, _for_ep(new, 1), opt).as_dict()
                rep_diff = max(rep_diff, replica_max_diff(model.moe_layers, opt))
            if step + 1 == cfg.replace_after:
                boundary = _to_cpu(logical_expert_tensors(model, opt))
            if step + 1 < cfg.steps:
                opt.zero_grad(set_to_none=True)
        return RunResult(losses, {n: p.detach().cpu() for n, p in model.dense_parameters()},
                         _to_cpu(logical_expert_tensors(model, opt)), move, boundary, rep_diff, rep_bytes)


def _dist_worker(rank: int, port: int, cfg: VerifyConfig, outdir: str) -> None:
    """One rank of the distributed check: the reference run, then the re-placed run(s)."""
    torch.set_num_threads(1)
    if cfg.device == "cuda":
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
    else:
        dev = torch.device("cpu")
    init_group(rank, cfg.dp, port, "nccl" if dev.type == "cuda" else "gloo", timeout_s=cfg.timeout_s)
    try:
        groups = ParallelGroups(cfg.dp, cfg.ep)
        setup = make_setup(cfg)
        out = {}
        for name, (start, new, dtype) in _runs(cfg, setup).items():
            with deterministic(cfg.seed):
                model = TinyMoE(cfg.model, cfg.ep, groups.ep_rank, groups.ep_group,
                                phy2log_LS=None if start is None else start.phy2log).to(dev, dtype)
                opt = _optimizer(model, cfg.lr)
                dense = [p for _, p in model.dense_parameters()]
                experts = model.expert_parameters()
                losses, move, boundary, rep_diff, rep_bytes = [], None, None, 0.0, []
                for step in range(cfg.steps):
                    rb = build_microbatches(setup.plan, setup.window, rank,
                                            setup.tokens_per_step[step], setup.routes_TLK, device=dev)
                    step_losses = []
                    for mb in rb.microbatches:
                        loss = model.loss_sum(mb) / setup.denom
                        loss.backward()
                        step_losses.append(float(loss.detach()))
                    losses.append(step_losses)
                    # replica partials → each expert's gradient on every holder (EP group)
                    rep_bytes.append(sum_replica_grads(model.moe_layers, groups.ep_group))
                    ordered_all_reduce([p.grad for p in dense])  # all D ranks
                    ordered_all_reduce([p.grad for p in experts], groups.edp_group)  # EDP shards
                    opt.step()
                    rep_diff = max(rep_diff, replica_max_diff(model.moe_layers, opt))
                    if new is not None and step + 1 == cfg.replace_after:
                        move = materialize(model.moe_layers, new, opt, groups.ep_group).as_dict()
                        rep_diff = max(rep_diff, replica_max_diff(model.moe_layers, opt))
                    if step + 1 == cfg.replace_after:
                        boundary = logical_expert_tensors(model, opt)
                    if step + 1 < cfg.steps:
                        opt.zero_grad(set_to_none=True)
                out[name] = RunResult(
                    losses, {n: p.detach().clone() for n, p in model.dense_parameters()},
                    logical_expert_tensors(model, opt), move, boundary, rep_diff, rep_bytes)
        torch.save({k: _to_cpu(dataclasses.asdict(v)) for k, v in out.items()}, Path(outdir) / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _to_cpu(x):
    if torch.is_tensor(x):
        return x.cpu()
    if isinstance(x, dict):
        return {k: _to_cpu(v) for k, v in x.items()}
    return x


def run_distributed(cfg: VerifyConfig) -> dict:
    """Spawn ``cfg.dp`` gloo processes; returns per rank ``{"reference": RunResult, "replaced": ...}``."""
    check_type(cfg, "cfg", VerifyConfig)
    with tempfile.TemporaryDirectory(prefix="routepack-verify-") as tmp:
        launch(_dist_worker, cfg.dp, (cfg, tmp), timeout_s=cfg.timeout_s,
               start_method=cfg.start_method)
        per_rank = []
        for r in range(cfg.dp):
            raw = torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False)
            per_rank.append({k: RunResult(**v) for k, v in raw.items()})
    return per_rank


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def compare_runs(ref: RunResult, new: RunResult) -> dict:
    """Largest absolute differences between two runs, by kind, and whether all are bitwise equal."""
    check_type(ref, "ref", RunResult)
    check_type(new, "new", RunResult)
    loss = max(abs(x - y) for a, b in zip(ref.losses, new.losses) for x, y in zip(a, b))
    dense = max(_max_diff(ref.dense[n], new.dense[n]) for n in ref.dense)
    identical = ref.losses == new.losses and all(torch.equal(ref.dense[n], new.dense[n]) for n in ref.dense)
    expert, same = _compare_experts(ref.experts, new.experts)
    identical &= same
    out = {"loss": loss, "dense": dense, "expert": expert}
    if ref.boundary is not None and new.boundary is not None:
        out["expert_at_replacement"], same = _compare_experts(ref.boundary, new.boundary)
        identical &= same
    out["max_abs_diff"] = max(out.values())
    out["bitwise_equal"] = bool(identical)
    return out


def _compare_experts(a: dict, b: dict) -> tuple[float, bool]:
    if set(a) != set(b):
        raise RuntimeError("the runs hold different logical experts")
    worst, identical = 0.0, True
    for key, d in a.items():
        if set(d) != set(b[key]):
            raise RuntimeError(f"expert {key}: different state kinds {sorted(d)} vs {sorted(b[key])}")
        for name, t in d.items():
            worst = max(worst, _max_diff(t, b[key][name]))
            identical &= torch.equal(t, b[key][name])
    return worst, identical


def _merge_ranks(per_rank: list[RunResult], cfg: VerifyConfig) -> tuple[RunResult, float]:
    """One logical view of a distributed run (each expert from the first rank holding it, losses
    of all ranks in rank order) and the largest difference between replicas (EDP shards, dense
    copies)."""
    replica = 0.0

    def merge(dicts):
        nonlocal replica
        merged: dict = {}
        for d_rank in dicts:
            for key, d in d_rank.items():
                if key not in merged:
                    merged[key] = d
                else:
                    replica = max(replica, max(_max_diff(t, merged[key][n]) for n, t in d.items()))
        if len(merged) != cfg.model.num_experts * cfg.model.num_layers:
            raise RuntimeError(f"ranks hold {len(merged)} logical experts, expected "
                               f"{cfg.model.num_experts * cfg.model.num_layers}")
        return merged

    experts = merge([r.experts for r in per_rank])
    boundary = merge([r.boundary for r in per_rank]) if per_rank[0].boundary is not None else None
    for res in per_rank:
        for n, t in res.dense.items():
            replica = max(replica, _max_diff(t, per_rank[0].dense[n]))
    losses = [[x for res in per_rank for x in res.losses[s]] for s in range(cfg.steps)]
    replica = max([replica] + [r.local_replica_diff for r in per_rank])
    return RunResult(losses, per_rank[0].dense, experts, None, boundary), replica


def _expert_kinds(a: RunResult, b: RunResult) -> dict[str, float]:
    """Largest expert differences by kind — weights, grads, Adam moments — at the end and at the
    step boundary of the migration."""
    out = {"weights": 0.0, "grads": 0.0, "adam": 0.0}
    pairs = [(a.experts, b.experts)]
    if a.boundary is not None and b.boundary is not None:
        pairs.append((a.boundary, b.boundary))
    for da, db in pairs:
        for key, d in da.items():
            for name, t in d.items():
                kind = "grads" if name.endswith(".grad") else "adam" if "." in name else "weights"
                out[kind] = max(out[kind], _max_diff(t, db[key][name]))
    return out


def _replica_report(runs: dict[str, RunResult], replica_diff: float) -> dict:
    """The replica check's comparisons (module doc): replicated vs reference (float32
    reassociation; in float64 the difference must shrink with the rounding), moved vs replicated
    (bitwise), copies of one expert (bitwise)."""
    ref, rep = runs["reference"], runs["replicated"]
    vs = compare_runs(ref, rep)
    kinds = _expert_kinds(ref, rep)
    same = compare_runs(rep, runs["moved"])
    vs64 = compare_runs(runs["reference64"], runs["replicated64"])
    return {"vs_reference": {**vs, **{f"expert_{k}": v for k, v in kinds.items()}},
            "max_abs_diff_float64": vs64["max_abs_diff"],
            "max_abs_diff_weights": kinds["weights"], "max_abs_diff_adam": kinds["adam"],
            "max_abs_diff": vs["max_abs_diff"],
            "moved_vs_replicated_max_abs_diff": same["max_abs_diff"],
            "moved_bitwise_equal": same["bitwise_equal"],
            "replica_max_diff": replica_diff}


def _verify_replicas(cfg: VerifyConfig, setup: Setup, single: bool, tol: float, report: dict) -> dict:
    """``verify_runtime`` with ``cfg.redundant`` > 0 (module doc: three runs)."""
    r = setup.replicas
    start, new = r["start"], r["new"]
    report.update({"redundant_experts": cfg.redundant, "tolerance": tol,
                   "max_replicas": int(max(start.logcnt.max(), new.logcnt.max())),
                   "replicated_experts_start": int((start.logcnt > 1).sum()),
                   "replicated_experts_new": int((new.logcnt > 1).sum()),
                   "logcnt_changes": int((start.logcnt != new.logcnt).sum())})
    ok = report["logcnt_changes"] > 0
    single_ref = None
    if single:
        t0 = time.perf_counter()
        runs = {name: run_single(cfg, False, setup, _for_ep(a, 1), _for_ep(b, 1), dtype)
                for name, (a, b, dtype) in _runs(cfg, setup).items()}
        single_ref = runs["reference"]
        cmp = _replica_report(runs, max(x.local_replica_diff for x in runs.values()))
        cmp["bytes_moved"] = runs["replicated"].move["bytes_moved"]
        cmp["replicas_added"] = runs["replicated"].move["replicas_added"]
        cmp["replicas_dropped"] = runs["replicated"].move["replicas_dropped"]
        cmp["seconds"] = round(time.perf_counter() - t0, 2)
        report["single_process"] = cmp
    if cfg.dp > 1:
        t0 = time.perf_counter()
        per_rank = run_distributed(cfg)
        merged = {}
        rep_diff = 0.0
        for name in per_rank[0]:
            merged[name], d = _merge_ranks([x[name] for x in per_rank], cfg)
            rep_diff = max(rep_diff, d)
        cmp = _replica_report(merged, rep_diff)
        moves = [x["replicated"].move for x in per_rank]
        cmp["bytes_moved"] = int(sum(m["bytes_moved"] for m in moves))  # all ranks, all shards
        cmp["bytes_sent_cross_rank"] = int(sum(m["bytes_sent"] for m in moves))
        cmp["bytes_moved_shuffled"] = int(sum(x["moved"].move["bytes_moved"] for x in per_rank))
        cmp["replicas_added"] = moves[0]["replicas_added"]
        cmp["replicas_dropped"] = moves[0]["replicas_dropped"]
        # gradient exchange among holders, all ranks, per step (the placement changes after
        # replace_after steps)
        cmp["replica_grad_bytes_per_step"] = [int(sum(x["replicated"].replica_grad_bytes[s] for x in per_rank))
                                              for s in range(cfg.steps)]
        if single_ref is not None:
            # same maths, different summation order (per-rank accumulation): close, not equal
            base = compare_runs(single_ref, merged["reference"])
            cmp["vs_single_process_loss_diff"] = base["loss"]
            # the same reassociation without replicas (EP run vs one process): the scale of the
            # float32 differences above
            cmp["reference_ep_vs_single_max_abs_diff"] = base["max_abs_diff"]
            ok &= cmp["vs_single_process_loss_diff"] <= 1e-4
        cmp["seconds"] = round(time.perf_counter() - t0, 2)
        report["distributed"] = cmp
    modes = [report[m] for m in ("single_process", "distributed") if m in report]
    for m in modes:
        ok &= (m["max_abs_diff"] <= tol and m["max_abs_diff_float64"] <= REPLICA_TOL_FLOAT64
               and m["moved_bitwise_equal"] and m["replica_max_diff"] == 0.0
               and m["replicas_added"] > 0 and m["bytes_moved"] > 0)
    last = modes[-1] if modes else {}
    report["max_abs_diff"] = max((m["max_abs_diff"] for m in modes), default=0.0)
    report["max_abs_diff_weights"] = max((m["max_abs_diff_weights"] for m in modes), default=0.0)
    report["max_abs_diff_adam"] = max((m["max_abs_diff_adam"] for m in modes), default=0.0)
    report["max_abs_diff_float64"] = max((m["max_abs_diff_float64"] for m in modes), default=0.0)
    report["replica_max_diff"] = max((m["replica_max_diff"] for m in modes), default=0.0)
    report["moved_bitwise_equal"] = all(m["moved_bitwise_equal"] for m in modes)
    report["bytes_moved"] = last.get("bytes_moved", 0)
    if "replica_grad_bytes_per_step" in last:
        report["replica_grad_bytes_per_step"] = last["replica_grad_bytes_per_step"]
    report["ok"] = bool(ok)
    return report


def verify_runtime(cfg: VerifyConfig | None = None, world_size: int = 4, ep: int = 2,
                   single: bool = True, tol: float | None = None) -> dict:
    """Run the checks; ``ok`` when every re-placed run equals its reference within ``tol``
    (0: bitwise) and the EP run's losses agree with the single-process run's within float
    reassociation (they sum in another order, so they are close, not equal).

    With ``cfg.redundant`` > 0 the replica check (module doc): ``tol`` defaults to
    :data:`REPLICA_TOL` for replicated vs reference; the moved run and the copies of an expert
    must be bitwise equal whatever ``tol``."""
    if cfg is not None:
        check_type(cfg, "cfg", VerifyConfig)
    check_int(world_size, "world_size")  # the type here; the ranges below, in the CLI's words
    check_int(ep, "ep")
    check_bool(single, "single")
    if tol is not None:
        check_number(tol, "tol", 0.0)
    if world_size < 1:
        raise InputError(f"--world-size must be ≥ 1, got {world_size}")
    if ep < 1:
        raise InputError(f"--ep must be ≥ 1, got {ep}")
    if world_size % ep:
        raise InputError(f"--world-size {world_size} is not divisible by --ep {ep}")
    base = cfg or VerifyConfig()
    if base.device == "cuda" and world_size > 1 and torch.cuda.device_count() < world_size:
        raise InputError(f"--device cuda with --world-size {world_size} needs {world_size} GPUs "
                         f"(nccl: one per rank); this machine has {torch.cuda.device_count()}")
    cfg = dataclasses.replace(base, dp=world_size, ep=ep,
                              num_samples=max(base.num_samples, 3 * base.rows * world_size))
    report: dict = {"world_size": world_size, "ep": ep, "dp": cfg.dp, "steps": cfg.steps,
                    "replace_after": cfg.replace_after, "tolerance": tol}
    setup = make_setup(cfg)
    if cfg.redundant:
        return _verify_replicas(cfg, setup, single, REPLICA_TOL if tol is None else tol, report)
    tol = 0.0 if tol is None else tol
    report["tolerance"] = tol
    moved_pl = int((setup.new_placement.first_slots != setup.plan.placement.first_slots).sum())
    report["experts_replaced"] = moved_pl
    diffs = []
    single_ref = None
    if single:
        t0 = time.perf_counter()
        single_ref = run_single(cfg, replace=False, setup=setup)
        new = run_single(cfg, replace=True, setup=setup)
        cmp = compare_runs(single_ref, new)
        cmp["bytes_moved"] = new.move["bytes_moved"]
        cmp["experts_moved"] = new.move["experts_moved"]
        cmp["seconds"] = round(time.perf_counter() - t0, 2)
        report["single_process"] = cmp
        diffs.append(cmp["max_abs_diff"])
    bytes_moved = report.get("single_process", {}).get("bytes_moved", 0)
    if world_size > 1:
        t0 = time.perf_counter()
        per_rank = run_distributed(cfg)
        ref, rep_ref = _merge_ranks([r["reference"] for r in per_rank], cfg)
        new, rep_new = _merge_ranks([r["replaced"] for r in per_rank], cfg)
        cmp = compare_runs(ref, new)
        moves = [r["replaced"].move for r in per_rank]
        cmp["bytes_moved"] = int(sum(m["bytes_moved"] for m in moves))  # all ranks, all shards
        cmp["bytes_sent_cross_rank"] = int(sum(m["bytes_sent"] for m in moves))
        cmp["bytes_local"] = int(sum(m["bytes_local"] for m in moves))
        cmp["experts_moved_per_shard"] = moves[0]["experts_moved"]
        cmp["replica_max_diff"] = max(rep_ref, rep_new)
        if single_ref is not None:
            # same maths, different summation order (per-rank accumulation): close, not equal
            ep_vs = compare_runs(single_ref, ref)
            cmp["vs_single_process_loss_diff"] = ep_vs["loss"]
            cmp["vs_single_process_max_diff"] = ep_vs["max_abs_diff"]
        cmp["seconds"] = round(time.perf_counter() - t0, 2)
        report["distributed"] = cmp
        diffs += [cmp["max_abs_diff"], cmp["replica_max_diff"]]
        bytes_moved = cmp["bytes_moved"]
    report["max_abs_diff"] = max(diffs) if diffs else 0.0
    report["bytes_moved"] = bytes_moved
    ok = report["max_abs_diff"] <= tol and moved_pl > 0
    if "distributed" in report and "vs_single_process_loss_diff" in report["distributed"]:
        # a wrong dispatch would change losses at the percent level; reassociation ~1e-7
        ok &= report["distributed"]["vs_single_process_loss_diff"] <= 1e-4
    report["ok"] = bool(ok)
    return report
