"""Net gain where users run us: verl's driver-side ``_balance_batch`` and slime's
``build_dp_schedule``, ours against the framework's own call, interleaved in one run.

    python experiments/seam_net_gain.py [--sizes 256 1024 4096] [--reps 3]
                                        [-o experiments/results/seam_net_gain]

Setup (the issue 38 trial): N samples per step in 4 mini-batches of N/4, lengths lognormal(6.3, 1.0)
clipped to 16..8,192 (padded to the longest), ``routed_experts`` [N, S, 4 layers, top-2] int16
from E = 32 with a skewed (Dirichlet 0.3) expert popularity per layer, DP = 8, EP = 8, cap 16,384,
the default cost (``qwen3-30b-a3b``). Each setting is (N, with / without routes, default budget /
``ROUTEPACK_TIME_LIMIT=0.1``); each rep runs verl's own ``RayPPOTrainer._balance_batch`` (verl
0.9.1's method compiled from the installed source, its helpers verl's own) and ours on a
fresh copy of the batch, alternating, after one warm-up call of each. Times are wall clock
around the call; ``added`` = ours − verl's own (medians); the split import / plan / apply and
the rows, saving and net saving are our record's. Net (measured) = predicted saving − added.
Goals: added ≤ the documented budget + 0.25 s; net > 0 at N = 1,024 with routes, default cost.

slime: the same lengths and routes as one step of N rollouts on dp_size = 8 (dynamic batch,
``max_tokens_per_gpu`` = 16,384); slime's own layout is RoutePack's reproduction, timed inside
the call (the record's ``theirs_s``), so ``added`` is the record's ``planning_s``.

Overlap (hidden work): ``install_balance_batch(overlap=True)`` ("balanced": a quick reorder at
once, the plan's at the update) and ``overlap="deferred"`` (one reorder, at the update) at
N = 1,024 with routes;
between ``_balance_batch`` and ``_update_actor`` the driver waits ``--other-work`` seconds (the
old / reference log-prob passes, on the workers: the driver sleeps on Ray, the GIL free), as a
``time.sleep``. Critical-path cost = time in ``_balance_batch`` + the wait for the plan + its
apply at the update, against verl's own ``_balance_batch``.
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

from _lib import report  # noqa: E402

CAP, E, LA, K, D, EP = 16384, 32, 4, 2, 8, 8


def verls_balance_batch():
    """verl 0.9.1's own ``RayPPOTrainer._balance_batch``, compiled from the installed verl's
    source (its module imports torchdata, codetiming and more that ``--no-deps`` leaves out, none
    of which the method uses) with verl's own helpers bound."""
    import ast
    import importlib.util

    import torch
    from verl import DataProto
    from verl.utils import seqlen_balancing as sb

    path = Path(importlib.util.find_spec("verl").origin).parent / "trainer/ppo/ray_trainer.py"
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RayPPOTrainer")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_balance_batch")
    ns = {"torch": torch, "DataProto": DataProto, "calculate_workload": sb.calculate_workload,
          "get_seqlen_balanced_partitions": sb.get_seqlen_balanced_partitions,
          "log_seqlen_unbalance": sb.log_seqlen_unbalance}
    exec(compile(ast.Module([fn], []), str(path), "exec"), ns)
    return ns["_balance_batch"]


def make_batch(N: int, seed: int, routes: bool):
    import torch
    from tensordict import TensorDict

    rng = np.random.default_rng(seed)
    lens = np.clip(rng.lognormal(6.3, 1.0, N), 16, 8192).astype(np.int64)
    S = int(lens.max())
    mask = (torch.arange(S)[None, :] < torch.as_tensor(lens)[:, None]).to(torch.int64)
    data = {"input_ids": mask.clone(), "attention_mask": mask, "response_mask": mask.clone()}
    per_sample = None
    if routes:
        R = torch.zeros(N, S, LA, K, dtype=torch.int16)
        for layer in range(LA):
            p = rng.dirichlet(np.full(E, 0.3))
            first = rng.choice(E, size=(N, S), p=p).astype(np.int16)
            second = (first + 1 + rng.integers(0, E - 1, size=(N, S), dtype=np.int16)) % E
            R[:, :, layer, 0] = torch.from_numpy(first)
            R[:, :, layer, 1] = torch.from_numpy(second.astype(np.int16))
        R *= mask[:, :, None, None].to(torch.int16)
        data["routed_experts"] = R
        # slime's form: one [len_i - 1, layers, top_k] array per sample
        per_sample = [R[i, :n - 1].numpy() for i, n in enumerate(lens.tolist())]
    return TensorDict(data, batch_size=[N]), lens, per_sample


def trainer_classes(N: int, routes: bool, env_limit: str | None, overlap: bool | str = False):
    """(verl's own class, ours): the real ``RayPPOTrainer._balance_batch`` on a minimal host
    (config, DP size), and the same host with ours installed."""
    from omegaconf import OmegaConf

    from routepack_opt.integrations import verl as rp_verl

    class Host:
        actor_rollout_wg = None
        use_prefix_grouper = False
        config = OmegaConf.create({"actor_rollout_ref": {"actor": {"ppo_mini_batch_size": N // 4},
                                                         "rollout": {"n": 1}}})

        def _get_dp_size(self, wg, role):
            return D

        def _update_actor(self, batch):
            return batch

    own = verls_balance_batch()
    Theirs = type("Theirs", (Host,), {"_balance_batch": own})
    Ours = type("Ours", (Host,), {"_balance_batch": own})
    old = os.environ.pop("ROUTEPACK_TIME_LIMIT", None)
    if env_limit is not None:
        os.environ["ROUTEPACK_TIME_LIMIT"] = env_limit
    try:
        rp_verl.install_balance_batch(Ours, max_token_len=CAP, num_experts=E if routes else None, ep_size=EP,
                                      overlap=overlap)
    finally:
        os.environ.pop("ROUTEPACK_TIME_LIMIT", None)
        if old is not None:
            os.environ["ROUTEPACK_TIME_LIMIT"] = old
    return Theirs, Ours


def _proto(td):
    from verl import DataProto

    return DataProto(batch=td.clone(), non_tensor_batch={"uid": np.arange(td.batch_size[0])})


def bench_verl(N: int, routes: bool, env_limit: str | None, reps: int, td) -> dict:
    from routepack_opt.integrations import verl as rp_verl

    Theirs, Ours = trainer_classes(N, routes, env_limit)
    theirs_t, ours_t, recs = [], [], []
    for rep in range(reps + 1):  # rep 0: warm-up of both
        for who in ("theirs", "ours") if rep % 2 == 0 else ("ours", "theirs"):
            data, m = _proto(td), {}
            t0 = time.perf_counter()
            (Theirs if who == "theirs" else Ours)()._balance_batch(data, m)
            dt = time.perf_counter() - t0
            if rep == 0:
                continue
            if who == "theirs":
                theirs_t.append(dt)
            else:
                ours_t.append(dt)
                recs.append(rp_verl.last_record())
            del data
    return _row("verl", N, routes, env_limit, theirs_t, ours_t, recs)


def bench_slime(N: int, routes: bool, env_limit: str | None, reps: int, lens, per_sample) -> dict:
    from routepack_opt.integrations import slime as rp_slime

    args = SimpleNamespace(use_dynamic_batch_size=True, max_tokens_per_gpu=CAP, num_experts=E,
                           expert_model_parallel_size=EP, balance_data=False)
    tp = {"dp_size": D, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
    kw = {} if env_limit is None else {"time_limit": float(env_limit)}
    ours_t, theirs_t, recs = [], [], []
    for rep in range(reps + 1):
        t0 = time.perf_counter()
        rp_slime.build_dp_schedule(args, tp, lens.tolist(), global_batch_size=N, rollout_indices=list(range(N)),
                                   routed_experts=per_sample if routes else None, **kw)
        dt = time.perf_counter() - t0
        (rec,) = rp_slime.last_records()
        if rep:
            ours_t.append(dt - rec.theirs_s)
            theirs_t.append(rec.theirs_s)
            recs.append(rec)
    return _row("slime", N, routes, env_limit, theirs_t, ours_t, recs)


def _row(seam, N, routes, env_limit, theirs_t, ours_t, recs) -> dict:
    med = statistics.median
    added = med(ours_t) - med(theirs_t)
    budget = med([r.budget_s for r in recs]) if all(r.budget_s is not None for r in recs) else None
    saving = med([r.saving_us for r in recs]) / 1e3
    return {"seam": seam, "N": N, "routes": "yes" if routes else "no",
            "setting": "default" if env_limit is None else f"ROUTEPACK_TIME_LIMIT={env_limit}",
            "budget ms": None if budget is None else 1e3 * budget,
            "theirs ms": 1e3 * med(theirs_t), "ours ms": 1e3 * med(ours_t), "added ms": 1e3 * added,
            "import ms": med([r.import_s for r in recs]) * 1e3, "plan ms": med([r.plan_s for r in recs]) * 1e3,
            "apply ms": med([r.apply_s for r in recs]) * 1e3,
            "rows": recs[-1].rows, "rows theirs": recs[-1].rows_theirs,
            "saving ms": saving, "net ms (record)": med([r.net_saving_us for r in recs]) / 1e3,
            "net ms (measured)": saving - 1e3 * added,
            "quick": sum(r.quick is not None for r in recs), "steps": len(recs),
            "added ≤ budget + 0.25 s": None if budget is None else bool(added <= budget + 0.25),
            "quick why": next((r.quick for r in recs if r.quick), "")}


def bench_overlap(N: int, other_work: float, reps: int, td, mode) -> dict:
    from routepack_opt.integrations import verl as rp_verl

    Theirs, Ours = trainer_classes(N, True, None, overlap=mode)
    theirs_t, crit, waits, recs = [], [], [], []
    for rep in range(reps + 1):
        data, m = _proto(td), {}
        t0 = time.perf_counter()
        Theirs()._balance_batch(data, m)
        th = time.perf_counter() - t0
        data, m = _proto(td), {}
        t = Ours()
        t0 = time.perf_counter()
        t._balance_batch(data, m)
        in_balance = time.perf_counter() - t0
        time.sleep(other_work)  # the log-prob passes: the driver waits on Ray
        t1 = time.perf_counter()
        t._update_actor(data)
        at_update = time.perf_counter() - t1
        if rep:
            theirs_t.append(th)
            crit.append(in_balance + at_update)
            waits.append(m.get("routepack/balance/wait_ms", float("nan")))
            recs.append(rp_verl.last_record())
    med = statistics.median
    return {"overlap": "balanced" if mode is True else mode, "N": N, "other work s": other_work,
            "theirs ms": 1e3 * med(theirs_t),
            "critical path ms": 1e3 * med(crit), "added ms": 1e3 * (med(crit) - med(theirs_t)),
            "added ms (record)": 1e3 * med([r.added_s for r in recs]),
            "wait ms": med(waits), "planning ms (hidden)": 1e3 * med([r.planning_s for r in recs]),
            "saving ms": med([r.saving_us for r in recs]) / 1e3,
            "net ms": med([r.saving_us for r in recs]) / 1e3 - 1e3 * (med(crit) - med(theirs_t))}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--other-work", type=float, nargs="+", default=[0.0, 2.0])
    ap.add_argument("--skip-overlap", action="store_true")
    ap.add_argument("-o", "--out", default=str(ROOT / "experiments/results/seam_net_gain"))
    a = ap.parse_args(argv)
    from routepack_opt.warmup import warm

    warm()
    rows = []
    overlap_rows = []
    for N in a.sizes:
        for routes in (False, True):
            td, lens, per_sample = make_batch(N, a.seed, routes)
            for env_limit in (None, "0.1"):
                rows.append(bench_verl(N, routes, env_limit, a.reps, td))
                print(rows[-1], file=sys.stderr, flush=True)
                rows.append(bench_slime(N, routes, env_limit, a.reps, lens, per_sample))
                print(rows[-1], file=sys.stderr, flush=True)
            if routes and N == 1024 and not a.skip_overlap:
                for mode in (True, "deferred"):
                    for w in a.other_work:
                        overlap_rows.append(bench_overlap(N, w, a.reps, td, mode))
                        print(overlap_rows[-1], file=sys.stderr, flush=True)
            del td, per_sample
    out = Path(a.out)
    cols = [c for c in rows[0] if c != "quick why"]
    fmt = {c: ".0f" for c in cols if "ms" in c}
    lines = ["# Net gain at the seams: ours vs the framework's own call, interleaved", "",
             (__doc__ or "").split("\n\n", 1)[1].strip(), "",
             f"Command: `python experiments/seam_net_gain.py --sizes {' '.join(map(str, a.sizes))} --reps {a.reps}`", ""]
    for seam in ("verl", "slime"):
        lines += [f"## {seam}", ""]
        lines += report.table(cols, [[r[c] for c in cols] for r in rows if r["seam"] == seam], fmt)
        lines.append("")
        whys = sorted({f"- N={r['N']}, routes {r['routes']}, {r['setting']}: {r['quick why']}" for r in rows
                       if r["seam"] == seam and r["quick why"]})
        if whys:
            lines += ["Quick path taken (first reason per setting):", "", *whys, ""]
    if overlap_rows:
        oc = list(overlap_rows[0])
        lines += ["## Overlap mode (verl, N = 1,024, routes, default budget)", "",
                  "`added ms` = critical path − verl's own call (medians); `added ms (record)`: the record's "
                  "`added_ms` (time in `_balance_batch` less its reorder + the wait + the reorder at the update).", ""]
        lines += report.table(oc, [[r[c] for c in oc] for r in overlap_rows], {c: ".0f" for c in oc if "ms" in c})
        lines.append("")
    report.write_md(out / "seam_net_gain.md", lines)
    report.write_json(out / "seam_net_gain.json", {"rows": rows, "overlap": overlap_rows})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
