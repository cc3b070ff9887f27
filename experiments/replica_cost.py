"""What a replicated expert costs in training, measured, against the step time a replicated plan saves.

    python experiments/replica_cost.py [--quick] [--out DIR] [--samples 512] [--ep 8 32]
                                       [--time-limit 10]

Cost, measured on this machine's CPUs (gloo over loopback, one thread per rank):
``runtime.replicas.sum_replica_grads`` — the exchange that gives every holder of an expert the sum
of its replicas' partial gradients — on P ∈ {2, 4} ranks, one layer, SwiGLU experts of H = F ∈ {256, 512, 1024}
(fp32 gradient 3·H·F·4 bytes), r ∈ {0, P, 2P} experts with a second copy on another rank. Median
of repeated calls, the slowest rank; the per-replica cost is the slope in r, the effective
bandwidth the busiest rank's bytes (sent + received) over the time (slope). Memory: the bytes a
replica slot adds (weights, gradient, Adam's two moments) read from the slot tensors after a step.

Saving, predicted: ``routepack gen-trace --preset deepseek-v3 --dispersion 1.25`` windows (L=58,
E=256, top-8) planned by ``routepack plan --redundant-experts`` N ∈ {0, P} with D = P (one EDP
shard); the predicted step time (makespan, µs, the one evaluator under the even-local rule) of
each. Against it, the replicas' gradient exchange of that plan at DeepSeek-V3's expert size
(3·7168·2048 parameters, bf16 gradients): the busiest rank's bytes (sent + received) per step, the
time they take at the CPU bandwidth measured here and at 50 GB/s (the preset's inter-node
migration bandwidth), and the break-even bandwidth at which the exchange costs what the plan
saves. A replica pays where the exchange, not overlapped with anything, stays below the saving.

Writes ``experiments/results/replica_cost/{replica_cost.json, replica_cost.md}``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _lib import report, settings

STUDY = "replica_cost"
DEEPSEEK_GRAD_BYTES = 3 * 7168 * 2048 * 2  # one expert's bf16 gradient
DEEPSEEK_STATE_BYTES = 3 * 7168 * 2048 * (2 + 2 + 12)  # weights, gradient, fp32 master + Adam
NET_BW = 50e9  # bytes/s, the deepseek-v3 preset's migration bandwidth


def _bench_worker(rank: int, port: int, P: int, sizes, reps, outdir: str) -> None:
    import torch
    import torch.distributed as dist

    from routepack_opt.core.placement import Placement
    from routepack_opt.runtime.dist import init_group
    from routepack_opt.runtime.materialize import slot_state_tensors
    from routepack_opt.runtime.moe import MoELayer
    from routepack_opt.runtime.replicas import replica_exchange_plan, sum_replica_grads

    torch.set_num_threads(1)
    init_group(rank, P, port)
    rows = []
    try:
        group = dist.new_group(list(range(P)))
        E = 4 * P
        for H in sizes:
            for r in (0, P, 2 * P):
                # experts 0..r-1 get a second copy in the redundant slots E..E+r-1, which lie on
                # other ranks than the first copies (slots 0..r-1)
                p2l = np.concatenate([np.arange(E), np.arange(r)])
                layer = MoELayer(H, H, E, 2, P, rank, group, redundant=r)
                layer.set_phy2log(p2l)
                for p in layer.slots.slot_params():
                    p.grad = torch.randn_like(p)
                plan = replica_exchange_plan([layer])
                sent = sum_replica_grads([layer], group, plan)  # warm
                times = []
                for _ in range(reps):
                    dist.barrier(group)
                    t0 = time.perf_counter()
                    sum_replica_grads([layer], group, plan)
                    times.append(time.perf_counter() - t0)
                opt = torch.optim.Adam(layer.parameters(), lr=1e-3)
                opt.step()
                per_slot = sum(t[0].numel() * t.element_size() for t in slot_state_tensors(layer, opt))
                busiest = exchange_volume(Placement(p2l[None], P, E), 3 * H * H * 4)["busiest_rank_bytes"] \
                    if r else 0.0
                rows.append({"P": P, "H": H, "replicated": r, "rank": rank, "bytes_sent": sent,
                             "busiest_rank_bytes": busiest,
                             "median_s": statistics.median(times), "slot_state_bytes": per_slot,
                             "grad_bytes": 3 * H * H * 4})
        Path(outdir, f"rank{rank}.json").write_text(json.dumps(rows))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def measure_exchange(P: int, sizes, reps: int) -> list[dict]:
    from routepack_opt.runtime.dist import launch

    with tempfile.TemporaryDirectory() as tmp:
        launch(_bench_worker, P, (P, tuple(sizes), reps, tmp), timeout_s=900)
        per_rank = [json.loads(Path(tmp, f"rank{q}.json").read_text()) for q in range(P)]
    out = []
    for rows in zip(*per_rank):  # same (H, r) order on every rank
        row = dict(rows[0])
        row["median_s"] = max(x["median_s"] for x in rows)  # the slowest rank sets the step
        row["bytes_sent"] = max(x["bytes_sent"] for x in rows)
        del row["rank"]
        out.append(row)
    return out


def fit(rows: list[dict]) -> list[dict]:
    """Per (P, H): the exchange time per replicated expert (slope in r, least squares) and the
    effective bandwidth (busiest rank's bytes sent + received over the time, slope over H's too)."""
    out = []
    for (P, H) in sorted({(r["P"], r["H"]) for r in rows}):
        pts = [r for r in rows if r["P"] == P and r["H"] == H]
        x = np.array([r["replicated"] for r in pts], float)
        y = np.array([r["median_s"] for r in pts])
        slope, icpt = np.polyfit(x, y, 1)
        xb = np.array([r["busiest_rank_bytes"] for r in pts])
        per_byte = np.polyfit(xb, y, 1)[0]
        out.append({"P": P, "H": H, "grad_bytes": pts[0]["grad_bytes"], "s_per_replica": float(slope),
                    "intercept_s": float(icpt),
                    "bandwidth_Bps": float(1.0 / per_byte) if per_byte > 0 else None,
                    "slot_state_bytes": pts[0]["slot_state_bytes"]})
    return out


def exchange_volume(placement, grad_bytes: int) -> dict:
    """Bytes per step of the replica gradient exchange under ``placement``: each holder sends its
    partial to every other rank holding the expert; the busiest rank's sent + received."""
    P, S_loc = placement.ep, placement.slots_per_rank
    sent = np.zeros(P)
    recv = np.zeros(P)
    total = 0
    for l in range(placement.num_layers):
        p2l = placement.phy2log[l]
        for e in np.flatnonzero(placement.logcnt[l] > 1):
            ranks = np.flatnonzero(p2l == e) // S_loc
            distinct = set(ranks.tolist())
            for r in ranks:
                others = len(distinct - {int(r)})
                sent[r] += others * grad_bytes
                total += others * grad_bytes
            for r in distinct:
                recv[r] += (len(ranks) - int((ranks == r).sum())) * grad_bytes
    busiest = float((sent + recv).max())
    return {"total_bytes": float(total), "busiest_rank_bytes": busiest,
            "replica_slots": int(placement.redundant * placement.num_layers)}


def plan_point(w_path: Path, P: int, red: int, time_limit: float, tmp: Path) -> dict:
    from routepack_opt.core.plan import load_plan

    out = tmp / f"plan_P{P}_R{red}.json"
    cmd = [sys.executable, "-m", "routepack_opt", "plan", str(w_path), "--dp", str(P), "--ep", str(P),
           "--capacity", "8192", "--cost", "deepseek-v3", "--redundant-experts", str(red),
           "--time-limit", str(time_limit), "-o", str(out), "--json"]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    rep = json.loads(res.stdout)
    row = {"P": P, "redundant": red, "makespan_us": rep["makespan"],
           "fb_bound_us": rep["force_balanced_lower_bound"], "gap_fb": rep["gap_force_balanced"],
           "replica_bytes_per_rank": rep.get("replica_bytes_per_rank"), "wall_s": time.perf_counter() - t0}
    if red:
        row.update(exchange_volume(load_plan(out).placement_object(), DEEPSEEK_GRAD_BYTES))
    return row


def main() -> None:
    ap = settings.parser(__doc__)
    settings.add_quick(ap)
    settings.add_out(ap, STUDY)
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--ep", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = settings.results_dir(STUDY, args.out)
    sizes, reps, Ps = ((256,), 3, (2,)) if args.quick else ((256, 512, 1024), 7, (2, 4))
    samples, eps = (64, [8]) if args.quick else (args.samples, args.ep)

    t0 = time.perf_counter()
    raw = [row for P in Ps for row in measure_exchange(P, sizes, reps)]
    fits = fit(raw)
    print(_table(["P", "H", "grad_bytes", "s_per_replica", "bandwidth_Bps", "slot_state_bytes"],
                 fits, {"s_per_replica": ".2e", "bandwidth_Bps": ".3g"}), flush=True)
    cpu_bw = statistics.median([f["bandwidth_Bps"] for f in fits if f["bandwidth_Bps"]])

    plans = []
    with tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)
        w_path = tmp / "w.npz"
        subprocess.run([sys.executable, "-m", "routepack_opt", "gen-trace", "--preset", "deepseek-v3",
                        "--samples", str(samples), "--seed", str(args.seed), "--dispersion", "1.25",
                        "-o", str(w_path)], check=True, capture_output=True)
        for P in eps:
            base = plan_point(w_path, P, 0, args.time_limit, tmp)
            rep = plan_point(w_path, P, P, args.time_limit, tmp)
            saved_s = (base["makespan_us"] - rep["makespan_us"]) * 1e-6
            rep["saved_s"] = saved_s
            rep["exchange_s_cpu"] = rep["busiest_rank_bytes"] / cpu_bw
            rep["exchange_s_50GBps"] = rep["busiest_rank_bytes"] / NET_BW
            rep["break_even_Bps"] = rep["busiest_rank_bytes"] / saved_s if saved_s > 0 else None
            rep["extra_memory_per_rank_bytes"] = rep["replica_slots"] / P * DEEPSEEK_STATE_BYTES
            plans += [base, rep]
    record = {"exchange_raw": raw, "exchange_fit": fits, "cpu_bandwidth_Bps": cpu_bw,
              "plans": plans, "samples": samples, "time_limit": args.time_limit, "seed": args.seed,
              "quick": args.quick, "seconds": time.perf_counter() - t0}
    report.write_json(out / f"{STUDY}.json", record)
    report.write_text(out / f"{STUDY}.md", render(record))
    print(render(record))


def _table(columns: list[str], rows: list[dict], formats: dict[str, str]) -> str:
    return "\n".join(report.table(columns, [[r.get(c) for c in columns] for r in rows], formats))


def render(rec: dict) -> str:
    lines = ["# Replica cost: measured exchange and memory vs the predicted saving", "",
             "Produced by `experiments/replica_cost.py` (module doc: method).", "",
             "## Replica gradient exchange on CPU (gloo, loopback, 1 thread per rank)", "",
             _table(["P", "H", "grad_bytes", "s_per_replica", "intercept_s", "bandwidth_Bps",
                           "slot_state_bytes"], rec["exchange_fit"],
                          {"s_per_replica": ".2e", "intercept_s": ".2e", "bandwidth_Bps": ".3g"}),
             "", f"Median effective bandwidth: {rec['cpu_bandwidth_Bps']:.3g} bytes/s. A replica slot "
             "holds weights, gradient and Adam's two moments: 4× the fp32 weight bytes.", "",
             f"## DeepSeek-V3-shaped window (N={rec['samples']}), `routepack plan --redundant-experts`", "",
             _table(["P", "redundant", "makespan_us", "fb_bound_us", "gap_fb", "saved_s",
                           "busiest_rank_bytes", "exchange_s_cpu", "exchange_s_50GBps", "break_even_Bps",
                           "extra_memory_per_rank_bytes"], rec["plans"],
                          {"makespan_us": ",.0f", "fb_bound_us": ",.0f", "gap_fb": ".4f",
                           "saved_s": ".3f", "busiest_rank_bytes": ".3g", "exchange_s_cpu": ".3g",
                           "exchange_s_50GBps": ".3g", "break_even_Bps": ".3g",
                           "extra_memory_per_rank_bytes": ".3g"}),
             "", "`saved_s`: predicted step time without replicas minus with them. `busiest_rank_bytes`: "
             "the replica gradient exchange of that plan at DeepSeek-V3's expert size (bf16 gradients), "
             "sent + received by the busiest EP rank per step; its time at the CPU bandwidth measured "
             "above and at 50 GB/s; `break_even_Bps`: the bandwidth at which the exchange costs the "
             "saving. `extra_memory_per_rank_bytes`: replica slots per rank × (bf16 weights + bf16 "
             "gradient + 12 bytes fp32 master and Adam moments per parameter)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
