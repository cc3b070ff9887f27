"""Routing-replay import at model scale (issue 44): throughput of ``import_replay`` before (the
reference numpy path, one Python iteration and several passes per sample) and after (the
compiled pass), the rollout hook's cost per sample, the bytes that reach the driver, and verl's
driver ``_balance_batch`` at N = 1,024 with counts in the batch against verl's own call.

    python experiments/bench_replay_import.py [--sizes 256 1024] [--shapes 48x8x128 61x8x256]
        [--formats verl slime routes] [--before-max 1024] [--repeats 3] [--no-balance]
        [-o experiments/results/bench_replay_import/bench_replay_import.json]

Inputs (seeded): lengths uniform in 1,300..3,900 tokens (mean about 2,600); every token picks K
distinct experts per layer ((b + j·s) mod E, s odd, E a power of two). Formats as recorded:
``verl`` a right-padded ``[N, S = max length, L, K]`` tensor with the ``attention_mask``, the last
position zero-filled (verl #7075, imputed); ids uint8 (the issue's measurement) and int16 (what
verl 0.9.1's agent loop records); ``slime`` a list of per-sample int32 ``[T - 1, L, K]`` tensors
(what ``Sample.update_from_meta_info`` decodes); ``routes`` one uint8 ``[ΣT, L, K]`` array and
lengths. Tensors are torch CPU tensors (the import reads numpy views of them).

Per case: wall-clock seconds of ``import_replay`` (min of ``--repeats``, after one warm-up call
that loads numba's cached kernels), M ids/s = valid tokens·L·K / seconds, and the peak of the
memory the call allocates (tracemalloc: numpy's allocations, the counts included; the routes
themselves are the input, not counted). "before" runs the same call with the compiled pass off
(the reference path); at ``N > --before-max`` it is skipped. Counts are checked equal before vs
after where both ran. numba threads: all (``NUMBA_NUM_THREADS``, 2 here); the machine is shared,
so the 1-minute load average is recorded per case, and the CPU seconds of the timed call (all
threads): ids per CPU-second × cores is what a quiet machine gives.

Hook: ``rollout_hook.sample_counts`` on one finished sample (verl: int16 ``[S, L, K]`` + mask;
slime: int32 ``[T - 1, L, K]``) on the CPU with torch, median over 16 samples. Bytes to the
driver: before, the routes (verl's padded int16 tensor; slime's int32 list); after, counts
``[N, L, E]`` int32 + lengths int64.

Balance (verl, N = 1,024, L = 48, K = 8, E = 128, int16 routes, dp = 8, ep = 8, max_token_len
16,384): verl 0.9.1's own ``RayPPOTrainer._balance_batch`` (its source, executed on a stand-in
trainer: the module's import needs torchdata, absent here) vs ``install_balance_batch``'s, each
on (a) a batch holding ``routed_experts`` (routing replay today: both reorder the routes; ours
imports them) and (b) a batch holding the hook's counts in ``non_tensor_batch`` instead (ours plans
from them; this script swaps the seam's window function, the seam itself reads routes today).
Median of ``--repeats`` after a warm-up round; the plan's time limit is the seam default.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import routepack_opt.replay.importer as rp  # noqa: E402  (import_replay and the compiled pass it tries first)
from routepack_opt.integrations import rollout_hook as hook  # noqa: E402

OUT = ROOT / "experiments/results/bench_replay_import/bench_replay_import.json"


def gen_lengths(N: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1300, 3901, N).astype(np.int64)


def routes_of(rng, T: int, L: int, K: int, E: int, dtype) -> np.ndarray:
    base = rng.integers(0, E, (T, L, 1))
    step = 2 * rng.integers(0, E // 2, (T, L, 1)) + 1
    return ((base + np.arange(K) * step) % E).astype(dtype)


def make_verl(lens, L, K, E, dtype, seed):
    rng = np.random.default_rng(seed)
    N, S = len(lens), int(lens.max())
    R = np.zeros((N, S, L, K), dtype)
    m = np.zeros((N, S), np.int64)
    for i, T in enumerate(lens):
        R[i, :T - 1] = routes_of(rng, int(T) - 1, L, K, E, dtype)  # the last position: zero-filled
        m[i, :T] = 1
    return torch.from_numpy(R), torch.from_numpy(m)


def make_slime(lens, L, K, E, seed):
    rng = np.random.default_rng(seed)
    return [torch.from_numpy(routes_of(rng, int(T) - 1, L, K, E, np.int32)) for T in lens]


def make_routes(lens, L, K, E, seed):
    rng = np.random.default_rng(seed)
    return torch.from_numpy(np.concatenate([routes_of(rng, int(T), L, K, E, np.uint8) for T in lens]))


def timed(fn, repeats: int, warm: bool = True):
    """(min wall seconds, CPU seconds of that call (all threads), peak bytes allocated by one call,
    result). ``warm=False`` (the reference path, no kernels): one call, traced while timed."""
    if not warm:
        tracemalloc.start()
        t0, c0 = time.perf_counter(), time.process_time()
        res = fn()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return wall, cpu, peak, res
    res = fn()  # warm-up: cached kernels loaded
    best, cpu = float("inf"), float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        res = fn()
        wall = time.perf_counter() - t0
        if wall < best:
            best, cpu = wall, time.process_time() - c0
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return best, cpu, peak, res


class reference_path:
    """The compiled pass off: import_replay runs the reference numpy path (the code before)."""

    def __enter__(self):
        self.saved = rp._fast_verl, rp._fast_slime, rp._fast_routes
        rp._fast_verl = rp._fast_slime = rp._fast_routes = lambda *a, **k: None

    def __exit__(self, *exc):
        rp._fast_verl, rp._fast_slime, rp._fast_routes = self.saved


def import_case(fmt, data, lens, E):
    if fmt.startswith("verl"):
        R, m = data
        return lambda: rp.import_replay(R, format="verl", num_experts=E, attention_mask=m)
    if fmt == "slime":
        return lambda: rp.import_replay(data, format="slime", num_experts=E)
    return lambda: rp.import_replay(data, format="routes", num_experts=E, lengths=lens)


def bench_imports(args) -> list[dict]:
    rows = []
    for shape in args.shapes:
        L, K, E = (int(x) for x in shape.split("x"))
        for N in args.sizes:
            lens = gen_lengths(N, args.seed)
            ids = int(lens.sum()) * L * K
            for fmt in args.formats:
                if fmt == "verl":
                    cases = [("verl-uint8", np.uint8), ("verl-int16", np.int16)]
                else:
                    cases = [(fmt, None)]
                for name, dt in cases:
                    if name == "verl-int16" and (N, L) != (args.sizes[0], 48) and not args.all_int16:
                        continue  # int16 at one size (memory: twice uint8's)
                    data = (make_verl(lens, L, K, E, dt, args.seed) if name.startswith("verl") else
                            make_slime(lens, L, K, E, args.seed) if name == "slime" else
                            make_routes(lens, L, K, E, args.seed))
                    fn = import_case(name, data, lens, E)
                    after_s, after_cpu, after_peak, after = timed(fn, args.repeats)
                    row = dict(format=name, N=N, L=L, K=K, E=E, ids=ids, tokens=int(lens.sum()),
                               after_s=after_s, after_Mids_s=ids / after_s / 1e6, after_cpu_s=after_cpu,
                               after_Mids_per_cpu_s=ids / after_cpu / 1e6, after_peak_MB=after_peak / 2**20,
                               counts_MB=N * L * E * 4 / 2**20, loadavg=os.getloadavg()[0])
                    if N <= args.before_max:
                        with reference_path():
                            before_s, before_cpu, before_peak, before = timed(fn, 1, warm=False)
                        np.testing.assert_array_equal(before.window.counts, after.window.counts)
                        assert before.report() == after.report()
                        row.update(before_s=before_s, before_Mids_s=ids / before_s / 1e6,
                                   before_Mids_per_cpu_s=ids / before_cpu / 1e6,
                                   before_peak_MB=before_peak / 2**20, speedup=before_s / after_s,
                                   counts_equal=True)
                    rows.append(row)
                    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}),
                          flush=True)
                    del data, fn, after
    return rows


def bench_hook(args) -> list[dict]:
    out = []
    for shape in args.shapes:
        L, K, E = (int(x) for x in shape.split("x"))
        N = 16
        lens = gen_lengths(N, args.seed)
        R, m = make_verl(lens, L, K, E, np.int16, args.seed)
        slime = make_slime(lens, L, K, E, args.seed)
        for name, call in (("verl", lambda i: hook.sample_counts(R[i], E, format="verl", attention_mask=m[i])),
                           ("slime", lambda i: hook.sample_counts(slime[i], E, format="slime"))):
            call(0)
            ts = []
            for i in range(N):
                t0 = time.perf_counter()
                call(i)
                ts.append(time.perf_counter() - t0)
            routes_bytes = (R.numel() * 2 if name == "verl" else sum(s.numel() for s in slime) * 4) / N
            out.append(dict(format=name, L=L, K=K, E=E, device="cpu", torch_threads=torch.get_num_threads(),
                            mean_tokens=float(lens.mean()), per_sample_ms=statistics.median(ts) * 1e3,
                            routes_bytes_per_sample=routes_bytes, counts_bytes_per_sample=L * E * 4 + 8))
            print(json.dumps(out[-1]), flush=True)
    return out


def driver_bytes(args) -> list[dict]:
    rows = []
    for shape in args.shapes:
        L, K, E = (int(x) for x in shape.split("x"))
        for N in args.sizes:
            lens = gen_lengths(N, args.seed)
            rows.append(dict(N=N, L=L, K=K, E=E, verl_routes_GB=N * int(lens.max()) * L * K * 2 / 1e9,
                             slime_routes_GB=int((lens - 1).sum()) * L * K * 4 / 1e9,
                             counts_MB=(N * L * E * 4 + N * 8) / 1e6))
    return rows


def verl_own_balance_batch():
    """verl 0.9.1's ``RayPPOTrainer._balance_batch``, its source executed with its own imports."""
    import verl.trainer.ppo as ppo
    from verl import DataProto
    from verl.utils import seqlen_balancing as vsb

    src = (Path(ppo.__file__).parent / "ray_trainer.py").read_text()
    node = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef) and n.name == "_balance_batch")
    ns = dict(torch=torch, DataProto=DataProto, calculate_workload=vsb.calculate_workload,
              get_seqlen_balanced_partitions=vsb.get_seqlen_balanced_partitions,
              log_seqlen_unbalance=vsb.log_seqlen_unbalance)
    exec(compile(ast.Module([node], []), "ray_trainer.py", "exec"), ns)  # noqa: S102
    return ns["_balance_batch"]


def bench_balance(args) -> dict:
    from omegaconf import OmegaConf
    from verl import DataProto

    from routepack_opt.integrations import verl as rp_verl
    from routepack_opt.integrations import verl_balance as rp_balance  # where plan_step reads the window

    N, L, K, E, D, CAP = 1024, 48, 8, 128, 8, 16384
    lens = gen_lengths(N, args.seed)
    R, m = make_verl(lens, L, K, E, np.int16, args.seed)
    counts = rp.import_replay(R, format="verl", num_experts=E, attention_mask=m).window.counts

    class Trainer:
        actor_rollout_wg = None
        use_prefix_grouper = False

        def __init__(self):
            self.config = OmegaConf.create({"actor_rollout_ref": {"actor": {"ppo_mini_batch_size": None}}})

        def _get_dp_size(self, wg, role):
            return D

    Trainer._balance_batch = verl_own_balance_batch()
    Own = type("Own", (Trainer,), {})
    Ours = type("Ours", (Trainer,), {})
    rp_verl.install_balance_batch(Ours, max_token_len=CAP, num_experts=E, ep_size=D, mini_batch_size=N)

    def batch(with_routes: bool, with_counts: bool):
        tensors = {"attention_mask": m.clone(), "input_ids": m.clone()}
        if with_routes:
            tensors["routed_experts"] = R
        non = {}
        if with_counts:
            col = np.empty(N, dtype=object)
            col[:] = list(counts)
            non[hook.COUNTS_KEY] = col
        return DataProto.from_dict(tensors=tensors, non_tensors=non or None)

    original = rp_balance._global_window

    def from_counts(lens_N, td, num_experts, moe_layer_freq):  # the seam reading the hook's counts
        return hook.window_from_counts(from_counts.counts, lens_N, top_k=K)

    cases = ("verl_own_routes", "ours_routes", "verl_own_counts", "ours_counts")
    out: dict[str, list[float]] = {k: [] for k in cases + ("import_of_routes",)}
    for c in range(args.repeats + 1):
        for name in cases:
            data = batch(name.endswith("routes"), name.endswith("counts"))
            if name == "ours_counts":
                from_counts.counts = hook.counts_from_non_tensor(data.non_tensor_batch)
                rp_balance._global_window = from_counts
            t0 = time.perf_counter()
            (Own if name.startswith("verl_own") else Ours)()._balance_batch(data, {})
            dt = time.perf_counter() - t0
            rp_balance._global_window = original
            del data
            if c:
                out[name].append(dt)
        t0 = time.perf_counter()
        rp.import_replay(R, format="verl", num_experts=E, attention_mask=m)
        if c:
            out["import_of_routes"].append(time.perf_counter() - t0)
    res = {k: statistics.median(v) for k, v in out.items()}
    res.update(N=N, L=L, K=K, E=E, dp=D, ep=D, max_token_len=CAP, repeats=args.repeats, loadavg=os.getloadavg()[0],
               added_over_verl_with_hook_s=res["ours_counts"] - res["verl_own_counts"],
               added_over_verl_with_routes_s=res["ours_routes"] - res["verl_own_routes"])
    print(json.dumps(res), flush=True)
    return res


def bench_stream(args) -> dict:
    """Counts arriving one sample at a time (random order) into StreamingCounts vs the batch
    collected at close (stacked per-sample counts → window), then the same plan from both."""
    from routepack_opt.api import plan_micro_batches

    N, L, K, E = 1024, 48, 8, 128
    rng = np.random.default_rng(args.seed)
    lens = gen_lengths(N, args.seed)
    p = rng.dirichlet(np.ones(E), size=(N, L))
    counts = rng.multinomial((K * lens)[:, None], p).astype(np.int32)  # [N, L, E], Σ_e = K·len
    counts = np.minimum(counts, lens[:, None, None]).astype(np.int32)
    fix = K * lens[:, None] - counts.sum(axis=2)  # the rare clipped count goes back to the lightest expert
    idx = np.argmin(counts, axis=2)
    np.put_along_axis(counts, idx[..., None], np.take_along_axis(counts, idx[..., None], 2) + fix[..., None], 2)
    per = [counts[i].copy() for i in range(N)]
    # a sweep budget, not a time limit: the same input gives the same plan (checked)
    opts = dict(dp_size=8, ep_size=8, max_tokens=16384, time_limit=600.0, max_sweeps=args.plan_sweeps, seed=0)
    st = hook.StreamingCounts(N, L, E, K)
    add_s, partial = [], None
    for j, i in enumerate(rng.permutation(N).tolist()):
        t0 = time.perf_counter()
        st.add(i, per[i], int(lens[i]))
        add_s.append(time.perf_counter() - t0)
        if j + 1 == int(0.9 * N):  # a provisional plan on 90 % of the batch, while the rest rolls out
            t0 = time.perf_counter()
            pw = st.partial_window()
            plan_micro_batches(pw.lengths, pw.counts, **opts)
            partial = time.perf_counter() - t0
    t0 = time.perf_counter()
    w = st.window()
    stream_input = time.perf_counter() - t0
    t0 = time.perf_counter()
    wb = hook.window_from_counts(per, lens, top_k=K)
    batch_input = time.perf_counter() - t0
    times: dict[str, list[float]] = {"stream": [], "batch": []}
    plans = {}
    for name in ("stream", "batch", "batch", "stream"):  # interleaved, min of two each
        ww = w if name == "stream" else wb
        t0 = time.perf_counter()
        plans[name] = plan_micro_batches(ww.lengths, ww.counts, **opts)
        times[name].append(time.perf_counter() - t0)
    stream_plan, batch_plan = min(times["stream"]), min(times["batch"])
    plan_s, plan_b = plans["stream"], plans["batch"]
    same = plan_s.micro_batches == plan_b.micro_batches if hasattr(plan_s, "micro_batches") else None
    res = dict(N=N, L=L, K=K, E=E, plan_options=opts, add_us_median=statistics.median(add_s) * 1e6,
               add_s_total=sum(add_s), provisional_plan_at_90pct_s=partial,
               close_input_stream_s=stream_input, close_input_batch_s=batch_input,
               plan_s_stream=stream_plan, plan_s_batch=batch_plan, same_plan=same,
               input_done_before_close=1 - stream_input / batch_input,
               close_work_removed=(batch_input - stream_input) / (batch_input + batch_plan),
               close_total_stream_s=stream_input + stream_plan, close_total_batch_s=batch_input + batch_plan)
    print(json.dumps(res), flush=True)
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--shapes", nargs="+", default=["48x8x128", "61x8x256"])
    ap.add_argument("--formats", nargs="+", default=["verl", "slime", "routes"])
    ap.add_argument("--before-max", type=int, default=1024)
    ap.add_argument("--all-int16", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-balance", action="store_true")
    ap.add_argument("--balance-only", action="store_true")
    ap.add_argument("--plan-sweeps", type=int, default=20)
    ap.add_argument("-o", "--output", type=Path, default=OUT)
    args = ap.parse_args(argv)
    import numba

    res = dict(command="python experiments/bench_replay_import.py " + " ".join(argv or sys.argv[1:]),
               loadavg_start=os.getloadavg(), cpus=os.cpu_count(), numba_threads=numba.get_num_threads(),
               driver_bytes=driver_bytes(args))
    if not args.balance_only:
        res.update(imports=bench_imports(args), hook=bench_hook(args))
    if not args.balance_only:
        res["stream"] = bench_stream(args)
    if not args.no_balance:
        res["balance"] = bench_balance(args)
    res["loadavg_end"] = os.getloadavg()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1) + "\n")
    tmp.replace(args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
