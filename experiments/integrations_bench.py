"""Ours vs each framework's own function, on windows built from routes in that framework's format.

    python experiments/integrations_bench.py [--slime-src DIR] [--seeds 3] [-o experiments/results/integrations_bench/integrations.md]

- slime: per-sample routes ``[len-1, layers, top_k]`` with a dense first layer (all-zero rows),
  imported with ``import_replay(format="slime")``. slime's own ``build_dp_schedule`` (round-robin,
  and ``balance_data`` = Karmarkar–Karp on slime's FLOP estimate) vs ours with ``routed_experts``.
  slime is not on PyPI: ``--slime-src`` is a checkout of THUDM/slime (only ``slime/utils/`` is
  imported: dp_schedule, seqlen_balancing, flops_utils — pure Python). Without it the slime rows
  are skipped and the table says so.
- verl: a per-rank batch ``routed_experts [B, S, layers, top_k]`` + ``attention_mask`` (zero-filled
  padding and last position), imported with ``import_replay(format="verl")``. verl 0.9.1's
  ``rearrange_micro_batches`` vs ours, per DP rank (verl calls it per rank).
- Megatron-Core: the placement seam only. Same packing (ours, from the slime windows), Megatron's
  contiguous layout (identity) vs RoutePack's LPT map applied by ``remap_routing``.

Every layout is scored by RoutePack's one evaluator (``Evaluator.score``, no trust in a planner's
own number) under both objectives; cap violations count cells over the cap with more than one
sample (slime allows a single oversize sample). Routes are synthetic: drawn per token from
``routepack_opt.trace`` windows (Qwen3-30B-A3B shape: E=128, top-8; fewer layers to keep the
token-level routes in memory).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _lib import report, settings  # noqa: E402

from routepack_opt.core.cost import get_preset  # noqa: E402
from routepack_opt.core.evaluate import Evaluator  # noqa: E402
from routepack_opt.core.plan import assignment_from_cells  # noqa: E402
from routepack_opt.core.topology import Topology  # noqa: E402
from routepack_opt.integrations.replay import import_replay  # noqa: E402
from routepack_opt.trace import generate_window  # noqa: E402

PRESET = "qwen3-30b-a3b"


def routes_from_counts(counts_LE: np.ndarray, length: int, rng) -> np.ndarray:
    """Per-token routes ``[length, L, k]`` whose counts are exactly ``counts_LE``: per layer, the
    k·length expert copies in expert order go to token ``j % length`` (an expert's copies are
    ≤ length consecutive positions, so a token never gets one expert twice); tokens shuffled."""
    L, E = counts_LE.shape
    k = int(counts_LE[0].sum()) // length
    out = np.empty((length, L, k), dtype=np.int16)
    for l in range(L):
        flat = np.repeat(np.arange(E, dtype=np.int16), counts_LE[l])
        out[:, l, :] = flat.reshape(k, length).T
        out[:, l, :] = out[rng.permutation(length), l, :]
    return out


def score(window, topo, cost, cells, placement):
    """rows, cap violations (multi-sample cells over the cap), makespans under both objectives."""
    R = len(cells)
    row, slot = assignment_from_cells(cells, window.num_samples)
    ev = Evaluator(window, topo, cost)
    over = sum(1 for rr in cells for c in rr if len(c) > 1 and int(window.lengths[c].sum()) > topo.capacity)
    empty = sum(1 for rr in cells for c in rr if not c)
    return {"rows": R, "violations": over, "empty": empty,
            "max-sum": ev.score(placement, row, slot, R, "max-sum").makespan,
            "sum-max": ev.score(placement, row, slot, R, "sum-max").makespan,
            "lb": ev.lower_bound(placement, R)}


def slime_cells(partitions, mbi, nmb, dp):
    """slime's per-rank schedule (one step) → cells[r][d]."""
    R = nmb[0]
    return [[[partitions[d][i] for i in mbi[d][r]] for d in range(dp)] for r in range(R)]


# --- slime ---------------------------------------------------------------------------------------
def bench_slime(args, slime_fn, seeds):
    from routepack_opt.integrations.slime import plan_dp_schedule

    cost = get_preset(PRESET).cost
    N, dp, ep, La = args.slime_samples, 16, 8, args.layers + 1  # G = 2 shards: the objectives differ
    freq = [0] + [1] * args.layers  # a dense first layer, recorded as all-zero rows
    rows = []
    for seed in seeds:
        w0 = generate_window(PRESET, N, seed, num_layers=args.layers)
        rng = np.random.default_rng(seed)
        routes = []
        for i in range(N):  # slime records len - 1 routes; its pad route covers the last token
            r = routes_from_counts(w0.counts[i], int(w0.lengths[i]), rng)[:-1]
            full = np.zeros((r.shape[0], La, r.shape[2]), dtype=np.int16)
            full[:, 1:] = r
            routes.append(full)
        imp = import_replay(routes, format="slime", num_experts=w0.num_experts)
        window = imp.window
        cap = int(window.lengths.max())  # the generator's max length = the preset's capacity
        topo = Topology(dp=dp, ep=ep, capacity=cap)
        lens = window.lengths.tolist()
        sargs = SimpleNamespace(micro_batch_size=1, use_dynamic_batch_size=True, max_tokens_per_gpu=cap,
                                balance_by_flops=False, hidden_size=2048, num_attention_heads=32,
                                num_query_groups=4, vocab_size=151936, ffn_hidden_size=6144,
                                num_experts=w0.num_experts, num_layers=La, kv_channels=128,
                                moe_ffn_hidden_size=768, moe_router_topk=w0.top_k, moe_layer_freq=freq,
                                expert_model_parallel_size=ep)
        tp = {"dp_size": dp, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
        ident = np.tile(np.arange(window.num_experts), (window.num_layers, 1))
        if slime_fn is not None:
            for bal in (False, True):
                sargs.balance_data = bal
                t0 = time.perf_counter()
                out = slime_fn(sargs, tp, lens, global_batch_size=N, rollout_indices=list(range(N)))
                dt = time.perf_counter() - t0
                rows.append(dict(framework="slime", seed=seed, method=f"slime build_dp_schedule"
                                 f"{' (balance_data)' if bal else ''}", seconds=dt,
                                 **score(window, topo, cost, slime_cells(*out[:3], dp), ident)))
        t0 = time.perf_counter()
        sched = plan_dp_schedule(sargs, tp, lens, global_batch_size=N, rollout_indices=list(range(N)),
                                 routed_experts=routes, moe_layer_freq=freq, cost=cost,
                                 max_sweeps=args.sweeps, seed=seed)
        dt = time.perf_counter() - t0
        cells = slime_cells(sched.partitions, sched.micro_batch_indices, sched.num_microbatches, dp)
        rows.append(dict(framework="slime", seed=seed, method="routepack build_dp_schedule (routed_experts)",
                         seconds=dt, **score(window, topo, cost, cells, sched.logical_to_physical[0])))
        # Megatron's placement seam on the same packing: contiguous (identity) vs our map.
        rows.append(dict(framework="megatron", seed=seed, method="Megatron contiguous experts, routepack packing",
                         seconds=0.0, **score(window, topo, cost, cells, ident)))
        rows.append(dict(framework="megatron", seed=seed, method="remap_routing with routepack's map",
                         seconds=0.0, **score(window, topo, cost, cells, sched.logical_to_physical[0])))
        print(f"slime seed {seed} done", file=sys.stderr)
    return rows


# --- verl ----------------------------------------------------------------------------------------
def verl_rank_batch(w0, rank: int, B: int, seed: int):
    """Rank ``rank``'s verl batch (samples ``rank·B ..``): right-padded, ``routed_experts`` zero-filled
    at padding and at the last position; returns (batch, imported window)."""
    import torch
    from tensordict import TensorDict

    rng = np.random.default_rng([seed, rank])
    idx = np.arange(rank * B, (rank + 1) * B)
    S = int(w0.lengths[idx].max())
    R = torch.zeros(B, S, w0.num_layers, w0.top_k, dtype=torch.int16)
    mask = torch.zeros(B, S, dtype=torch.int64)
    for b, i in enumerate(idx):
        n = int(w0.lengths[i])
        r = routes_from_counts(w0.counts[i], n, rng)
        R[b, :n - 1] = torch.from_numpy(r[:-1])  # the engine returns no route for the last token
        mask[b, :n] = 1
    batch = TensorDict({"input_ids": mask.clone(), "attention_mask": mask, "routed_experts": R}, batch_size=[B])
    window = import_replay(R, format="verl", num_experts=w0.num_experts, attention_mask=mask).window
    return batch, window


def _verl_methods(cost, args, seed):
    from verl.utils import seqlen_balancing as vsb

    from routepack_opt.integrations import verl as rp_verl

    return (("verl rearrange_micro_batches", vsb.rearrange_micro_batches),
            ("routepack rearrange_micro_batches",
             lambda b, c, **kw: rp_verl.rearrange_micro_batches(b, c, cost=cost, max_sweeps=args.sweeps,
                                                              seed=seed, **kw)))


def agreed_counts(fn, batches, cap):
    """Every rank's micro-batches with one agreed count, as a ``dp_group`` gives in training.
    verl's ``dp_group`` path needs CUDA (``get_device_name()`` has no CPU platform in 0.9.1), so
    agreement is reached through the functions' own ``min_num_micro_batch``: raise it to the
    largest count any rank returns until all ranks return the same count (verl's sync is an
    all-reduce MAX of the count, then more micro-batches until every rank fits the cap)."""
    K = 1
    while True:
        t0 = time.perf_counter()
        parts = [fn(bt, cap, min_num_micro_batch=K)[1] for bt in batches]
        dt = time.perf_counter() - t0
        ks = [len(p) for p in parts]
        if len(set(ks)) == 1:
            return parts, dt
        K = max(ks)


def bench_verl(args, seeds):
    """Per rank (D = 1, no dp_group), and across ranks with one agreed count (D = ranks)."""
    from routepack_opt.core.window import Window

    cost = get_preset(PRESET).cost
    B, ranks = args.verl_batch, args.verl_ranks
    rows = []
    for seed in seeds:
        w0 = generate_window(PRESET, B * ranks, 100 + seed, num_layers=args.verl_layers)
        cap = int(w0.lengths.max())
        windows, batches = [], []
        for rank in range(ranks):
            batch, window = verl_rank_batch(w0, rank, B, seed)
            windows.append(window)
            batches.append(batch)
            topo = Topology(dp=1, ep=1, capacity=cap)
            ident = np.tile(np.arange(window.num_experts), (window.num_layers, 1))
            for name, fn in _verl_methods(cost, args, seed):
                t0 = time.perf_counter()
                _, parts = fn(batch, cap)
                dt = time.perf_counter() - t0
                rows.append(dict(framework="verl (per rank, D=1)", seed=seed, rank=rank, method=name, seconds=dt,
                                 **score(window, topo, cost, [[p] for p in parts], ident)))
        # Across ranks with one agreed count (what a dp_group gives), scored as D = ranks shards of
        # one slot each (ep = 1), where the two objectives differ.
        full = Window(np.concatenate([w.lengths for w in windows]), np.concatenate([w.counts for w in windows]))
        topo = Topology(dp=ranks, ep=1, capacity=cap)
        ident = np.tile(np.arange(full.num_experts), (full.num_layers, 1))
        for name, fn in _verl_methods(cost, args, seed):
            parts_D, dt = agreed_counts(fn, batches, cap)
            R = len(parts_D[0])
            cells = [[[d * B + i for i in parts_D[d][r]] for d in range(ranks)] for r in range(R)]
            rows.append(dict(framework=f"verl (agreed count, D={ranks})", seed=seed, method=name, seconds=dt,
                             **score(full, topo, cost, cells, ident)))
        del batches
        print(f"verl seed {seed} done", file=sys.stderr)
    return rows


def load_slime(src: str | None):
    if not src:
        return None
    sys.path.insert(0, str(Path(src).resolve()))
    from slime.utils.dp_schedule import build_dp_schedule

    return build_dp_schedule


def table(rows, group_keys):
    """Mean over seeds (and ranks) per method, with the ratio to the framework's own function."""
    out = []
    fws = []
    for r in rows:
        if r["framework"] not in fws:
            fws.append(r["framework"])
    for fw in fws:
        rr = [r for r in rows if r["framework"] == fw]
        methods = []
        for r in rr:
            if r["method"] not in methods:
                methods.append(r["method"])
        base = {}
        for m in methods:
            sel = [r for r in rr if r["method"] == m]
            agg = {k: float(np.mean([r[k] for r in sel])) for k in ("rows", "violations", "empty", "max-sum",
                                                                   "sum-max", "lb", "seconds")}
            agg["gap"] = float(np.mean([r["max-sum"] / r["lb"] for r in sel]))
            if not base:
                base = {k: np.array([r[k] for r in sel]) for k in ("max-sum", "sum-max")}
            rel = {k: float(np.mean(np.array([r[k] for r in sel]) / base[k])) for k in ("max-sum", "sum-max")}
            out.append((fw, m, agg["rows"], agg["violations"], agg["empty"], agg["max-sum"], rel["max-sum"],
                        agg["sum-max"], rel["sum-max"], agg["gap"], agg["seconds"]))
    ms = report.num(".2f", per=1e3)  # µs → ms
    return "\n".join(report.table(
        ["framework", "method", "rows", "cap violations", "empty cells", "makespan max-sum (ms)", "vs framework",
         "makespan sum-max (ms)", "vs framework", "gap to LB (max-sum)", "time (s)"], out,
        formats={2: ".2f", 3: ".2f", 4: ".0f", 5: ms, 6: ".3f", 7: ms, 8: ".3f", 9: ".3f", 10: ".2f"},
        align="llrrrrrrrrr"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slime-src", help="a THUDM/slime checkout (slime is not on PyPI)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=8, help="MoE layers of the slime/megatron windows")
    ap.add_argument("--slime-samples", type=int, default=256)
    ap.add_argument("--verl-batch", type=int, default=64, help="samples per DP rank")
    ap.add_argument("--verl-ranks", type=int, default=2)
    ap.add_argument("--verl-layers", type=int, default=4)
    ap.add_argument("--sweeps", type=int, default=50, help="annealing sweeps per replica (deterministic)")
    ap.add_argument("-o", "--output", default=str(settings.RESULTS / "integrations_bench" / "integrations.md"))
    args = ap.parse_args(argv)
    seeds = list(range(args.seeds))
    t0 = time.perf_counter()
    slime_fn = load_slime(args.slime_src)
    rows = bench_slime(args, slime_fn, seeds) + bench_verl(args, seeds)
    wall = time.perf_counter() - t0
    import verl

    cmd = "python experiments/integrations_bench.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = f"""# Integrations: ours vs each framework's own function

Command: `{cmd.strip()}` ({wall:.0f} s wall on the shared 2-core machine).

Windows are built from routes in each framework's own format and imported with
`routepack_opt.integrations.replay.import_replay`; every layout is scored by RoutePack's
evaluator (cost preset `{PRESET}`, µs → ms), both objectives. Mean over {len(seeds)} seeds
(verl: and {args.verl_ranks} DP ranks); "vs framework" is the mean per-instance ratio to the
framework's own function (first row of each block; < 1 is faster). Cap violations: micro-batches
with more than one sample over the token cap. Gap: makespan / lower bound (max-sum).

- **slime**: N = {args.slime_samples} samples per step (global_batch_size = N rollouts), D = 16, EP = 8 (2 EDP shards),
  E = 128, top-8, {args.layers} MoE layers + 1 dense layer (all-zero rows, dropped on import), cap =
  `max_tokens_per_gpu` = longest sample. slime's function is {'the real `slime.utils.dp_schedule.build_dp_schedule` from the checkout given by `--slime-src`' if slime_fn else '**not run** (no `--slime-src`; slime is not on PyPI)'}. Slime has no expert placement: its layouts are scored with Megatron's contiguous layout.
- **verl** {verl.__version__}: per DP rank B = {args.verl_batch} samples, {args.verl_layers} MoE layers, cap = `max_token_len` = longest sample
  of the step, `routed_experts` zero-filled at padding and at the last position (verl #7075).
  Two settings. Per rank without a `dp_group` (D = 1): both objectives are then the sum of the
  micro-batch costs and per-sample attention cost does not depend on the packing, so only the
  micro-batch count (row overhead) and the cap can differ. Across {args.verl_ranks} ranks with one
  agreed micro-batch count (what `dp_group` gives in training; reached through each function's own
  `min_num_micro_batch`, because verl 0.9.1's `dp_group` path needs CUDA), scored as
  D = {args.verl_ranks} slots (EP = 1: verl packs each rank's own, already dispatched samples, so the
  expert term is each rank's own tokens), where the objectives differ.
- **megatron**: the placement seam on the slime windows: the same packing (ours), Megatron's
  contiguous experts vs RoutePack's LPT map applied by `remap_routing`.

{table(rows, None)}

Reading it: slime's and RoutePack's schedules both choose which samples share a micro-batch and
which rank runs it, so the joint cost (attention tails per cell, busiest EP rank per row) can
move; the Megatron rows isolate what the placement alone gives on the same packing. verl's seam
runs on each rank's already-dispatched samples: the per-sample attention cost and each rank's
token total do not depend on how the rank packs them, so only the micro-batch count (per-row
overhead), the cap and, across ranks, the alignment of rows (sum-max) can change. Moving work
between ranks needs verl's DP-balance seam (`_balance_batch`, equal sample counts per rank), which
this issue's `equal_samples_per_slot` option would serve; it is not implemented yet.

Raw records (one per seed/rank/method):

```
{chr(10).join(str({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}) for r in rows)}
```
"""
    out = Path(args.output)
    report.write_text(out, text)
    print(text)


if __name__ == "__main__":
    main()
