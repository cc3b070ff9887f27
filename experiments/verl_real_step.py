"""The step verl really runs (issue 49): verl 0.9.1's own default path, its ``keep_minibatch=True``
path and RoutePack's driver seam, all scored by the one evaluator, and interleaved timings of the
real ``RayPPOTrainer._balance_batch`` against ours.

    python experiments/verl_real_step.py [--sizes 256 1024 4096] [--seeds 3] [--steps 3]
                                         [--routes both|yes|no] [-o experiments/results/verl_real_step]

Setup (the trainer-seams-3 trial): verl's real ``RayPPOTrainer`` (a subclass that stubs nothing
this script calls; ``_update_actor`` / ``_update_critic`` are never reached), 4 actor mini-batches
(``ppo_mini_batch_size`` = N / 32 prompts, ``rollout.n`` = 8), D = EP = 8, E = 64, 8 MoE layers,
top-4 ``routed_experts`` (int16, Dirichlet(0.3) expert popularity per layer), cap 16,384, lengths
lognormal(8.3, 0.45) clipped to 64..16,384 (near the cap), the ``qwen3-30b-a3b`` cost. "With
routes": the seam has ``num_experts`` and the batch its routes; "lengths only": neither.

Table 1 (quality, per N / routes / seed): predicted step time (update of every mini-batch + the
forward-only passes, old log-prob and reference, ms) of verl's default path (its own
``_balance_batch``, the actor's slices, ``rearrange_micro_batches`` per rank, run), of its
``keep_minibatch=True`` path, and of the plan our seam applies (``max_sweeps`` unset, default
budget); which was applied; the forward passes' share and the ranks' token balance
(``global_seqlen/balanced_min/max``) with and without RoutePack.

Table 2 (cost, per N / routes / setting): ``--steps`` steps of verl's own call and ours on fresh
copies of one batch, alternating, after one warm-up call of each (reported apart): wall ms of
each, our ``added_ms`` per step against the budget, whether the search ran, ``net_saving_ms``.
Goals: ours ≤ theirs on every step; mean ≥ 3 % better than verl's default with routes; added ≤
budget + 25 ms on every step after the first; net > 0 at N = 1,024 with routes and defaults.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _lib import report, settings  # noqa: E402

CAP, E, LA, K, D, EP, N_ROLL, MINI_BATCHES = 16384, 64, 8, 4, 8, 8, 8, 4


def make_batch(N: int, seed: int, routes: bool):
    """A right-padded verl batch: input_ids, attention_mask, response_mask (and routed_experts)."""
    import torch
    from tensordict import TensorDict

    rng = np.random.default_rng(seed)
    lens = np.clip(rng.lognormal(8.3, 0.45, N), 64, CAP).astype(np.int64)
    S = int(lens.max())
    mask = (torch.arange(S)[None, :] < torch.as_tensor(lens)[:, None]).to(torch.int64)
    data = {"input_ids": mask.clone(), "attention_mask": mask, "response_mask": mask.clone()}
    if routes:
        R = torch.zeros(N, S, LA, K, dtype=torch.int16)
        for layer in range(LA):
            p = rng.dirichlet(np.full(E, 0.3))
            first = rng.choice(E, size=(N, S), p=p).astype(np.int64)
            for j in range(K):  # top-k choices: the popularity's draw, then distinct experts 17 apart
                R[:, :, layer, j] = torch.from_numpy(((first + j * 17) % E).astype(np.int16))
        R *= mask[:, :, None, None].to(torch.int16)
        data["routed_experts"] = R
    return TensorDict(data, batch_size=[N]), lens


def trainer_class():
    """verl's real RayPPOTrainer, constructed without its __init__ (no Ray workers): the config,
    DP size (its own _get_dp_size over a worker group's dispatch info) and the passes it runs."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    class Trainer(RayPPOTrainer):
        def __init__(self, N: int):  # noqa: D107 - RayPPOTrainer's own needs Ray workers
            from omegaconf import OmegaConf

            self.config = OmegaConf.create({"actor_rollout_ref": {
                "actor": {"ppo_mini_batch_size": N // (N_ROLL * MINI_BATCHES), "use_dynamic_bsz": True,
                          "shuffle": False, "data_loader_seed": 42},
                "rollout": {"n": N_ROLL}}})
            self.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": list(range(D))})
            self.use_reference_policy, self.use_critic, self.use_prefix_grouper = True, False, False

        def _update_actor(self, batch):
            raise AssertionError("not reached")

        _update_critic = _update_actor

    return Trainer


def _proto(td):
    from verl import DataProto

    return DataProto(batch=td.clone(), non_tensor_batch={"uid": np.arange(td.batch_size[0])})


def install(routes: bool, env_limit: str | None):
    """A fresh subclass of the real trainer with our _balance_batch (ROUTEPACK_TIME_LIMIT as given)."""
    from routepack_opt.integrations import verl as rp_verl

    Ours = type("Ours", (trainer_class(),), {})
    old = os.environ.pop("ROUTEPACK_TIME_LIMIT", None)
    if env_limit is not None:
        os.environ["ROUTEPACK_TIME_LIMIT"] = env_limit
    try:
        rp_verl.install_balance_batch(Ours, max_token_len=CAP, num_experts=E if routes else None, ep_size=EP)
    finally:
        os.environ.pop("ROUTEPACK_TIME_LIMIT", None)
        if old is not None:
            os.environ["ROUTEPACK_TIME_LIMIT"] = old
    return Ours


def _window(td, lens, routes: bool):
    from routepack_opt.integrations._common import length_only_window
    from routepack_opt.integrations.verl_balance import _global_window

    return _global_window(lens, td, E, None) if routes else length_only_window(lens)


def score_plans(window, plans, routes: bool, passes: int, placements=None) -> tuple[float, float]:
    """(step µs, forward µs) of ``plans[k][d]`` (global ids), by the one evaluator: every
    mini-batch's update (identity placement, or ``placements[k]``) + the forward passes."""
    from routepack_opt.core.cost import get_preset
    from routepack_opt.core.evaluate import Evaluator
    from routepack_opt.core.topology import Topology
    from routepack_opt.integrations.verl_balance import _layout_of, _rank_of, forward_us

    cost = get_preset("qwen3-30b-a3b").cost
    N = window.num_samples
    topo = Topology(dp=D, ep=EP if routes else 1, capacity=CAP, equal_samples_per_slot=True)
    ident = np.tile(np.arange(window.num_experts), (window.num_layers, 1))
    upd = 0.0
    for k, p in enumerate(plans):
        idx = np.concatenate([np.asarray(mb, dtype=np.int64) for mbs in p for mb in mbs])
        pl = ident if placements is None or placements[k] is None else placements[k]
        upd += Evaluator(window.subset(idx), topo, cost).score_layout(pl, _layout_of(p, idx, N), "max-sum").makespan
    fwd = forward_us(window, _rank_of(plans, N), topo, cost, passes)
    return upd + fwd, fwd


def score_verl(td, lens, routes: bool, keep: bool, trainer) -> tuple[float, float, int, list]:
    """verl's own path (default or keep_minibatch) run and scored: (step µs, forward µs, rows,
    tokens per rank)."""
    from routepack_opt.integrations.verl_balance import VerlStepConfig, verl_balance_fn, verl_step_layout

    cfg = VerlStepConfig.from_trainer(trainer, keep)
    st = verl_step_layout(lens, D, cfg, max_token_len=CAP, balance_fn=verl_balance_fn(), trainer=trainer)
    step, fwd = score_plans(_window(td, lens, routes), st.plans, routes, cfg.forward_passes)
    m = len(lens) // D
    tok = [int(lens[st.perm[d * m:(d + 1) * m]].sum()) for d in range(D)]
    assert st.source == "verl", st.source
    return step, fwd, st.rows, tok


def applied_plans(data) -> list:
    """``[k][d]``: the micro-batches (original ids, column ``uid``) our seam applied, read back
    from the reordered batch's plan columns (rank d's chunk; mini-batch k = the k-th plan id)."""
    uid = np.asarray(data.non_tensor_batch["uid"], dtype=np.int64)
    pid = data.batch["routepack_plan"].numpy()
    mbn = data.batch["routepack_micro_batch"].numpy()
    m = uid.size // D
    ids = list(dict.fromkeys(pid[:m].tolist()))
    out = []
    for p in ids:
        per_rank = []
        for d in range(D):
            sl = slice(d * m, (d + 1) * m)
            here = pid[sl] == p
            per_rank.append([uid[sl][here & (mbn[sl] == j)].tolist() for j in range(int(mbn[sl][here].max()) + 1)])
        out.append(per_rank)
    return out


def quality(N: int, routes: bool, seed: int) -> dict:
    from routepack_opt.integrations import verl as rp_verl

    td, lens = make_batch(N, seed, routes)
    Trainer = trainer_class()
    t = Trainer(N)
    theirs, fwd_theirs, rows_theirs, tok_theirs = score_verl(td, lens, routes, False, t)
    keep, _, rows_keep, _ = score_verl(td, lens, routes, True, t)
    Ours = install(routes, None)
    data, m = _proto(td), {}
    Ours(N)._balance_batch(data, m)
    rec = rp_verl.last_record()
    on_lengths = routes and bool(rec.quick) and "planned on lengths" in rec.quick
    if on_lengths:  # the record's scores are on lengths: ours re-scored on the routes, experts left as they are
        ours, fwd_ours = score_plans(_window(td, lens, routes), applied_plans(data), routes, 2)
    else:  # the record's scores are the evaluator's on this window (ours with its expert placement)
        assert abs(rec.predicted_us_theirs - theirs) <= 1e-6 * theirs, (rec.predicted_us_theirs, theirs)
        ours, fwd_ours = rec.predicted_us, rec.forward_us
    return {"N": N, "routes": "yes" if routes else "no", "seed": seed,
            "verl default ms": theirs / 1e3, "verl keep_minibatch ms": keep / 1e3, "ours ms": ours / 1e3,
            "ours vs default": (theirs - ours) / theirs, "ours vs keep": (keep - ours) / keep,
            "applied": rec.applied, "planned on": "routes" if routes and not on_lengths else "lengths",
            "rows ours / verl / keep": f"{rec.rows} / {rows_theirs} / {rows_keep}",
            "forward ms ours / verl": f"{fwd_ours / 1e3:.1f} / {fwd_theirs / 1e3:.1f}",
            "seqlen max/min ours": f"{m['global_seqlen/balanced_max']:,} / {m['global_seqlen/balanced_min']:,}",
            "seqlen max/min verl": f"{max(tok_theirs):,} / {min(tok_theirs):,}",
            "quick": (rec.quick or "")[:100]}


def timing(N: int, routes: bool, env_limit: str | None, steps: int, seed: int) -> list[dict]:
    """verl's own call and ours, alternating on fresh copies of one batch; step -1 is the warm-up."""
    from routepack_opt.integrations import verl as rp_verl

    td, _ = make_batch(N, seed, routes)
    Trainer = trainer_class()
    Ours = install(routes, env_limit)
    rows = []
    for step in range(-1, steps):
        times = {}
        for who in ("verl", "ours") if step % 2 == 0 else ("ours", "verl"):
            data, m = _proto(td), {}
            t0 = time.perf_counter()
            (Trainer if who == "verl" else Ours)(N)._balance_batch(data, m)
            times[who] = time.perf_counter() - t0
            if who == "ours":
                rec = rp_verl.last_record()
        # "all": every mini-batch searched; "some": at least one kept its quick plan (quick names the first)
        searched = "all" if rec.quick is None and rec.applied == "routepack" else \
            "some" if rec.applied == "routepack" and rec.quick and "predicted saving" in rec.quick else "no"
        rows.append({"N": N, "routes": "yes" if routes else "no",
                     "setting": "default" if env_limit is None else f"ROUTEPACK_TIME_LIMIT={env_limit}",
                     "step": "warm-up" if step < 0 else step, "verl ms": 1e3 * times["verl"],
                     "ours ms": 1e3 * times["ours"], "added ms": 1e3 * rec.added_s,
                     "budget ms": None if rec.budget_s is None else 1e3 * rec.budget_s,
                     "warm-up ms": None if rec.warmup_s is None else 1e3 * rec.warmup_s,
                     "import ms": None if rec.import_s is None else 1e3 * rec.import_s,
                     "searched": searched, "applied": rec.applied,
                     "saving ms": None if rec.saving_us is None else rec.saving_us / 1e3,
                     "net_saving_ms": None if rec.net_saving_us is None else rec.net_saving_us / 1e3,
                     "added ≤ budget + 25 ms": None if rec.budget_s is None or step < 1
                     else bool(rec.added_s <= rec.budget_s + 0.025),
                     "why": (rec.quick or rec.fallback or "")[:90]})
        print(report.cell(rows[-1]))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--routes", choices=("both", "yes", "no"), default="both")
    ap.add_argument("--timing-sizes", type=int, nargs="*", default=None,
                    help="sizes of the timing table (default: --sizes without 4,096)")
    ap.add_argument("--limits", nargs="+", default=["default", "0.1"],
                    help="settings of the timing table: default and/or ROUTEPACK_TIME_LIMIT values")
    ap.add_argument("-o", "--out", default=None, help="output folder (default experiments/results/verl_real_step)")
    args = ap.parse_args(argv)
    route_opts = {"both": (True, False), "yes": (True,), "no": (False,)}[args.routes]
    qual = []
    for N in args.sizes:
        for routes in route_opts:
            for s in range(args.seeds):
                qual.append(quality(N, routes, N * 1000 + s))
                print(report.cell(qual[-1]))
    timings = []
    for N in args.timing_sizes if args.timing_sizes is not None else [n for n in args.sizes if n < 4096]:
        for routes in route_opts:
            for limit in args.limits:
                timings += timing(N, routes, None if limit == "default" else limit, args.steps, N * 1000)
    cols_q = list(qual[0]) if qual else []
    summary = []
    for N in args.sizes:
        for routes in route_opts:
            rs = [r for r in qual if r["N"] == N and r["routes"] == ("yes" if routes else "no")]
            summary.append((N, "yes" if routes else "no", len(rs),
                            statistics.mean(r["ours vs default"] for r in rs),
                            min(r["ours vs default"] for r in rs), sum(r["applied"] == "routepack" for r in rs)))
    lines = ["# verl's real step: default path, keep_minibatch, ours (issue 49)", "",
             f"Command: `python experiments/verl_real_step.py {' '.join(argv or sys.argv[1:])}`", "",
             "## Predicted step time (update + forward passes), by the one evaluator", ""]
    lines += report.table(cols_q, [list(r.values()) for r in qual],
                          formats={"ours vs default": report.pct, "ours vs keep": report.pct,
                                   "verl default ms": ".1f", "verl keep_minibatch ms": ".1f", "ours ms": ".1f"})
    lines += ["", "## Summary: ours against verl's real default path", ""]
    lines += report.table(["N", "routes", "seeds", "mean gain", "worst gain", "ours applied"], summary,
                          formats={"mean gain": report.pct, "worst gain": report.pct})
    if timings:
        lines += ["", "## Interleaved timings: verl's own _balance_batch and ours (wall, this machine)", ""]
        lines += report.table(list(timings[0]), [list(r.values()) for r in timings],
                              formats={k: ".1f" for k in ("verl ms", "ours ms", "added ms", "budget ms",
                                                          "warm-up ms", "import ms", "saving ms", "net_saving_ms")})
    out = settings.results_dir("verl_real_step", args.out)
    report.write_md(out / "table.md", lines)
    report.write_json(out / "rows.json", {"quality": qual, "timings": timings})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
