"""The overlap modes' critical path against verl's own ``_balance_batch``, and slime's added time
against its budget (issue 49, "Must show": "the same for slime's seam and for both overlap modes").

    python experiments/verl_overlap.py [--n 1024] [--steps 4] [--other-work 0.5 2.0]
                                       [--slime-steps 4] [-o experiments/results/verl_overlap]

verl: the real ``RayPPOTrainer`` (verl 0.9.1, its ``__init__`` skipped: it starts Ray worker
groups; only ``_update_actor`` / ``_update_critic`` stubbed), D = EP = 8 ranks, 4 mini-batches,
cap 16,384, lengths lognormal(6.3, 1.0) clipped to 16..8,192 and padded to the longest, int16
``routed_experts`` [N, S, layers, top-k] from E experts with a skewed (Dirichlet 0.3) popularity
per layer (defaults: the trainer-seams-3 trial's E = 64, 8 layers, top-4). Each step runs, on a
fresh copy of the batch and interleaved (the order rotates every step): verl's own
``_balance_batch``; ours synchronous; ``overlap=True`` ("balanced"); ``overlap="deferred"``.
Between ``_balance_batch`` and ``_update_actor`` the driver sleeps ``--other-work`` seconds (the
log-prob passes run on the workers while the driver waits on Ray). Critical path = the time in
``_balance_batch`` + the time in ``_update_actor`` (the wait for the background plan and its
apply); verl's own and the synchronous mode's update cost nothing here. ``added`` = critical path
− verl's own, per step; ``net`` = the record's predicted saving − added. The first step of each
mode (warm-up: compilation, the route import's first pass) is reported apart.

slime: ``build_dp_schedule`` on the same lengths and routes (one array per sample) as
``--slime-steps`` steps of N / steps rollouts on dp_size = 8 (dynamic batch,
``max_tokens_per_gpu`` = 16,384), default budget and ``time_limit=0.05``; per step the record's
``planning_s`` (what the step adds: slime's own layout is timed apart) against ``budget_s``.
Goal (issue 49 item 7): added ≤ budget + 25 ms on every step after the first.

Writes ``verl_overlap.md`` and ``verl_overlap.json`` under ``-o``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _lib import report  # noqa: E402

CAP, D = 16384, 8


def make_batch(N: int, seed: int, E: int, layers: int, top_k: int):
    """(TensorDict, lengths, slime's per-sample routes)."""
    import torch
    from tensordict import TensorDict

    rng = np.random.default_rng(seed)
    lens = np.clip(rng.lognormal(6.3, 1.0, N), 16, 8192).astype(np.int64)
    S = int(lens.max())
    mask = (torch.arange(S)[None, :] < torch.as_tensor(lens)[:, None]).to(torch.int64)
    R = torch.zeros(N, S, layers, top_k, dtype=torch.int16)
    for layer in range(layers):
        p = rng.dirichlet(np.full(E, 0.3))
        first = rng.choice(E, size=(N, S), p=p)
        for k in range(top_k):  # distinct experts per token: consecutive offsets from the first
            R[:, :, layer, k] = torch.from_numpy(((first + k) % E).astype(np.int16))
    R *= mask[:, :, None, None].to(torch.int16)
    td = TensorDict({"input_ids": torch.from_numpy(rng.integers(1, 50000, (N, S))) * mask, "attention_mask": mask,
                     "response_mask": mask.clone(), "routed_experts": R}, batch_size=[N])
    per_sample = [R[i, :n - 1].numpy() for i, n in enumerate(lens.tolist())]
    return td, lens, per_sample


def trainers(N: int, E: int):
    """{mode: a real RayPPOTrainer instance}: verl's own, ours synchronous and both overlap modes."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from routepack_opt.integrations import verl as rp_verl

    def make(name, **kw):
        cls = type(name, (RayPPOTrainer,), {"_update_actor": lambda self, b: b, "_update_critic": lambda self, b: b})
        if name != "verl":
            rp_verl.install_balance_batch(cls, max_token_len=CAP, num_experts=E, ep_size=D, **kw)
        t = cls.__new__(cls)
        t.config = OmegaConf.create({"actor_rollout_ref": {"actor": {"ppo_mini_batch_size": N // 4},
                                                           "rollout": {"n": 1}}})
        t.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": list(range(D))})
        return t

    return {"verl": make("verl"), "sync": make("sync"), "balanced": make("balanced", overlap=True),
            "deferred": make("deferred", overlap="deferred")}


def bench_verl(a) -> list[dict]:
    from verl import DataProto

    from routepack_opt.integrations import verl as rp_verl

    td, _, _ = make_batch(a.n, a.seed, a.experts, a.layers, a.top_k)
    ts = trainers(a.n, a.experts)
    modes = list(ts)
    rows = []
    for step in range(a.steps):
        for work in a.other_work:
            got = {}
            for m in modes[step % 4:] + modes[:step % 4]:
                data, metrics = DataProto(batch=td.clone(), non_tensor_batch={"uid": np.arange(a.n)}), {}
                rp_verl.pop_records()
                t0 = time.perf_counter()
                ts[m]._balance_batch(data, metrics)
                in_balance = time.perf_counter() - t0
                time.sleep(work)
                t1 = time.perf_counter()
                ts[m]._update_actor(data)
                at_update = time.perf_counter() - t1
                rec = rp_verl.last_record() if m != "verl" else None
                got[m] = (in_balance + at_update, rec)
                del data
            theirs = got["verl"][0]
            for m in modes[1:]:
                crit, rec = got[m]
                saving = None if rec is None or rec.saving_us is None else rec.saving_us / 1e3
                added = 1e3 * (crit - theirs)
                rows.append({"step": step, "other work s": work, "mode": m, "verl ms": 1e3 * theirs,
                             "critical path ms": 1e3 * crit, "added ms": added,
                             "budget ms": None if rec is None or rec.budget_s is None else 1e3 * rec.budget_s,
                             "saving ms": saving, "net ms": None if saving is None else saving - added,
                             "searched": rec is not None and rec.quick is None,
                             "quick why": "" if rec is None or rec.quick is None else rec.quick[:80]})
                print(rows[-1], file=sys.stderr, flush=True)
    return rows


def bench_slime(a) -> list[dict]:
    from routepack_opt.integrations import slime as rp_slime

    _, lens, per_sample = make_batch(a.n, a.seed + 1, a.experts, a.layers, a.top_k)
    args = SimpleNamespace(use_dynamic_batch_size=True, max_tokens_per_gpu=CAP, num_experts=a.experts,
                           expert_model_parallel_size=D, balance_data=False)
    tp = {"dp_size": D, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
    rows = []
    for label, kw in (("default", {}), ("time_limit=0.05", {"time_limit": 0.05})):
        for rep in range(2):  # rep 0: the process's first call (warm-up of this setting)
            rp_slime.build_dp_schedule(args, tp, lens.tolist(), global_batch_size=a.n // a.slime_steps,
                                       rollout_indices=list(range(a.n)), routed_experts=per_sample, **kw)
            for rec in rp_slime.last_records():
                over = 1e3 * (rec.planning_s - rec.budget_s) if rec.budget_s is not None else None
                rows.append({"setting": label, "call": rep, "step": rec.step, "budget ms": _ms(rec.budget_s),
                             "added ms": 1e3 * rec.planning_s, "over budget ms": over,
                             "holds (≤ budget + 25)": None if over is None else bool(over <= 25.0),
                             "saving ms": rec.saving_us / 1e3, "net ms": rec.net_saving_us / 1e3,
                             "quick": rec.quick or ""})
                print(rows[-1], file=sys.stderr, flush=True)
    return rows


def _ms(s):
    return None if s is None else 1e3 * s


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--other-work", type=float, nargs="+", default=[0.5, 2.0])
    ap.add_argument("--slime-steps", type=int, default=4)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-slime", action="store_true")
    ap.add_argument("--skip-verl", action="store_true")
    ap.add_argument("-o", "--out", default=str(ROOT / "experiments/results/verl_overlap"))
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    verl_rows = [] if a.skip_verl else bench_verl(a)
    slime_rows = [] if a.skip_slime else bench_slime(a)
    med = statistics.median
    lines = ["# verl overlap modes and slime's budget", "",
             f"N = {a.n}, D = EP = {D}, E = {a.experts}, {a.layers} layers, top-{a.top_k}, cap {CAP}; "
             f"{a.steps} steps; `python experiments/verl_overlap.py --n {a.n} --steps {a.steps}`", "",
             "## verl: critical path against verl's own `_balance_batch` (steps after the first)", ""]
    summary = []
    for work in a.other_work:
        for m in ("sync", "balanced", "deferred"):
            rs = [r for r in verl_rows if r["mode"] == m and r["other work s"] == work and r["step"] > 0]
            if rs:
                summary.append({"mode": m, "other work s": work, "verl ms": med(r["verl ms"] for r in rs),
                                "critical path ms": med(r["critical path ms"] for r in rs),
                                "added ms (median)": med(r["added ms"] for r in rs),
                                "added ms (max)": max(r["added ms"] for r in rs),
                                "searched": f"{sum(r['searched'] for r in rs)}/{len(rs)}",
                                "net ms (median)": med(r["net ms"] for r in rs if r["net ms"] is not None)
                                if any(r["net ms"] is not None for r in rs) else None})
    if summary:
        cols = list(summary[0])
        lines += report.table(cols, [[r[c] for c in cols] for r in summary], {c: ".0f" for c in cols if "ms" in c})
    if verl_rows:
        lines += ["", "Every step:", ""]
        cols = list(verl_rows[0])
        lines += report.table(cols, [[r[c] for c in cols] for r in verl_rows], {c: ".0f" for c in cols if "ms" in c})
    if slime_rows:
        lines += ["", "## slime: added time against the budget per step (call 0: the process's first)", ""]
        cols = list(slime_rows[0])
        lines += report.table(cols, [[r[c] for c in cols] for r in slime_rows], {c: ".1f" for c in cols if "ms" in c})
    report.write_md(out / "verl_overlap.md", lines)
    report.write_json(out / "verl_overlap.json", {"verl": verl_rows, "slime": slime_rows, "summary": summary})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
