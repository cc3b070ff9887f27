"""Re-placing experts changes nothing: train a tiny MoE model, re-place its experts mid-run, and
compare with a run that never re-places (``routepack verify-runtime``).

Both runs start from the same logical model (initialization is keyed by logical expert id) and
see the same packed micro-batches with the same replayed routes. The re-placed run materializes a
new placement after ``replace_after`` optimizer steps (weights, gradients and Adam state move).
Compared: every micro-batch loss, every dense parameter, and every logical expert's weights,
gradients and Adam moments at the end. With deterministic settings on CPU in float32 they are
bitwise equal (see :mod:`routepack_opt.runtime.moe` for why).

Modes: one process holding all E slots (the D DP slots of the plan run one after another, with
gradient accumulation), and ``world_size`` gloo processes (D = world_size DP ranks, EP groups of P
ranks, real all-to-all token dispatch, ordered all-reduce of gradients).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from routepack_opt.core.errors import InputError
from routepack_opt.core.plan import Plan
from routepack_opt.core.testing import random_layout, random_window
from routepack_opt.core.topology import Topology
from routepack_opt.runtime.batches import build_microbatches, routes_from_counts, synthetic_tokens
from routepack_opt.runtime.dist import ParallelGroups, deterministic, init_group, launch, ordered_all_reduce
from routepack_opt.runtime.materialize import materialize
from routepack_opt.runtime.model import TinyMoE, TinyMoEConfig, logical_expert_tensors

__all__ = ["VerifyConfig", "RunResult", "verify_runtime", "run_single", "run_distributed",
           "compare_runs", "make_setup"]


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

    def __post_init__(self):
        E = self.model.num_experts
        for key in ("dp", "ep", "rows", "steps", "num_samples"):
            if getattr(self, key) < 1:
                raise InputError(f"verify-runtime: {key} must be ≥ 1, got {getattr(self, key)}")
        if self.dp % self.ep:
            raise InputError(f"verify-runtime: world size {self.dp} is not divisible by ep={self.ep}")
        if E % self.ep:
            raise InputError(f"verify-runtime: E={E} experts is not divisible by ep={self.ep}")
        if self.num_samples < self.rows * self.dp:
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


@dataclasses.dataclass
class Setup:
    window: object
    plan: Plan
    routes_TLK: np.ndarray
    tokens_per_step: list[np.ndarray]
    new_placement_LE: np.ndarray
    denom: float  # target tokens of the window: loss = Σ token CE / denom


def make_setup(cfg: VerifyConfig) -> Setup:
    """Window, plan (random valid layout, identity placement), replayed routes, tokens and the new
    placement — a pure function of the config, so every process derives the same."""
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
    return Setup(window, plan, routes_from_counts(window, seed=cfg.seed), tokens, new_pl,
                 float((window.lengths - 1).sum()))


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


def _optimizer(model: TinyMoE, lr: float):
    # foreach=False: the plain per-tensor loop, elementwise, identical for every slot
    return torch.optim.Adam(model.parameters(), lr=lr, foreach=False)


def run_single(cfg: VerifyConfig, replace: bool, setup: Setup | None = None) -> RunResult:
    """One process, all E slots local; the plan's D slots run in turn (gradient accumulation)."""
    setup = setup or make_setup(cfg)
    dev = torch.device(cfg.device)
    with deterministic(cfg.seed):
        model = TinyMoE(cfg.model).to(dev)
        opt = _optimizer(model, cfg.lr)
        losses, move, boundary = [], None, None
        for step in range(cfg.steps):
            batches = [build_microbatches(setup.plan, setup.window, d, setup.tokens_per_step[step],
                                          setup.routes_TLK, device=dev) for d in range(cfg.dp)]
            step_losses = [[0.0] * cfg.rows for _ in range(cfg.dp)]
            for r in range(cfg.rows):  # row by row, as the slots would run them
                for d in range(cfg.dp):
                    loss = model.loss_sum(batches[d].microbatches[r]) / setup.denom
                    loss.backward()
                    step_losses[d][r] = float(loss.detach())
            losses.append([x for per_slot in step_losses for x in per_slot])  # slot-major
            opt.step()
            if replace and step + 1 == cfg.replace_after:
                # at the step boundary, with gradients still present: they move too
                move = materialize(model.moe_layers, setup.new_placement_LE, opt).as_dict()
            if step + 1 == cfg.replace_after:
                boundary = _to_cpu(logical_expert_tensors(model, opt))
            if step + 1 < cfg.steps:
                opt.zero_grad(set_to_none=True)
        return RunResult(losses, {n: p.detach().cpu() for n, p in model.dense_parameters()},
                         _to_cpu(logical_expert_tensors(model, opt)), move, boundary)


def _dist_worker(rank: int, port: int, cfg: VerifyConfig, outdir: str) -> None:
    """One rank of the distributed check: the reference run, then the re-placed run."""
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
        for replace in (False, True):
            with deterministic(cfg.seed):
                model = TinyMoE(cfg.model, cfg.ep, groups.ep_rank, groups.ep_group).to(dev)
                opt = _optimizer(model, cfg.lr)
                dense = [p for _, p in model.dense_parameters()]
                experts = model.expert_parameters()
                losses, move, boundary = [], None, None
                for step in range(cfg.steps):
                    rb = build_microbatches(setup.plan, setup.window, rank,
                                            setup.tokens_per_step[step], setup.routes_TLK, device=dev)
                    step_losses = []
                    for mb in rb.microbatches:
                        loss = model.loss_sum(mb) / setup.denom
                        loss.backward()
                        step_losses.append(float(loss.detach()))
                    losses.append(step_losses)
                    ordered_all_reduce([p.grad for p in dense])  # all D ranks
                    ordered_all_reduce([p.grad for p in experts], groups.edp_group)  # replicas
                    opt.step()
                    if replace and step + 1 == cfg.replace_after:
                        move = materialize(model.moe_layers, setup.new_placement_LE, opt,
                                           groups.ep_group).as_dict()
                    if step + 1 == cfg.replace_after:
                        boundary = logical_expert_tensors(model, opt)
                    if step + 1 < cfg.steps:
                        opt.zero_grad(set_to_none=True)
                out["replaced" if replace else "reference"] = RunResult(
                    losses, {n: p.detach().clone() for n, p in model.dense_parameters()},
                    logical_expert_tensors(model, opt), move, boundary)
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
    return RunResult(losses, per_rank[0].dense, experts, None, boundary), replica


def verify_runtime(cfg: VerifyConfig | None = None, world_size: int = 4, ep: int = 2,
                   single: bool = True, tol: float = 0.0) -> dict:
    """Run the checks; ``ok`` when every re-placed run equals its reference within ``tol``
    (0: bitwise) and the EP run's losses agree with the single-process run's within float
    reassociation (they sum in another order, so they are close, not equal)."""
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
    moved_pl = int((setup.new_placement_LE != setup.plan.placement).sum())
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
