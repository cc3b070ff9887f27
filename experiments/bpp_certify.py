"""R* certifier on the classic 1D bin-packing benchmarks ($ROUTEPACK_BPP_DIR, known optima).

With one DP slot (D=1) and no row rules, R* is the bin-packing optimum of the sizes under the
capacity, so every instance checks the certifier against a proved optimum. Per instance it runs
``certify_rows(sizes, Topology(dp=1, ep=1, capacity=C), time_limit)`` and records rows, status,
method and seconds; results go to a JSON-lines file as they come (a rerun skips instances already
there) and the per-set summary table is rewritten after every set.

    python experiments/bpp_certify.py                         # all sets, 10 s per instance
    python experiments/bpp_certify.py --sets hard28 --limit 5 --out /tmp/x.md
    python experiments/bpp_certify.py --sets hard28 --only BPP14 BPP40 --out /tmp/x.md  # by name
    python experiments/bpp_certify.py --render --time-limit 10 --workers 1  # markdown from the .jsonl
    python experiments/bpp_certify.py --lp-bound --time-limit 10  # the certified LP bound vs the optimum

``--lp-bound`` runs column generation alone (``models.colgen.gilmore_gomory`` until no column
prices out or the time limit) on every instance and re-derives its bound from the integer duals
(``core.bounds.dual_bound``): how often ⌈LP⌉ equals the known optimum (IRUP), per set, against L2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
from _lib import report, settings

from routepack_opt.certify import BinPackUndecided, certify_rows
from routepack_opt.core.bounds import dual_bound
from routepack_opt.core.topology import Topology
from routepack_opt.models.colgen import gilmore_gomory, types_of
from routepack_opt.warmup import warm

# The external BPP collection (not shipped): $ROUTEPACK_BPP_DIR, else ../shared/data/bpp beside the repo.
DATA = Path(os.environ.get("ROUTEPACK_BPP_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data" / "bpp")
SETS = ["falkenauer_u", "falkenauer_t", "scholl_1", "scholl_2", "scholl_3", "waescher",
        "schwerin_1", "schwerin_2", "hard28"]
TARGET = {"falkenauer_u", "falkenauer_t", "scholl_1", "scholl_2", "scholl_3", "waescher",
          "schwerin_1", "schwerin_2"}


def run_instance(rec: dict, time_limit: float, workers: int) -> dict:
    sizes = np.asarray(rec["sizes"], dtype=np.int64)
    topo = Topology(dp=1, ep=1, capacity=int(rec["capacity"]))
    t0 = time.perf_counter()
    try:
        cert = certify_rows(sizes, topo, time_limit=time_limit, num_workers=workers)
        row = {**cert.as_dict(), "detail": cert.detail}
    except BinPackUndecided as exc:
        row = {"rows": None, "status": "undecided", "lower_bound": None, "method": "-",
               "seconds": time.perf_counter() - t0, "detail": str(exc)}
    row.update(name=rec["name"], n=int(rec["n"]), capacity=int(rec["capacity"]),
               optimum=int(rec["optimum"]), wall=time.perf_counter() - t0)
    row["proved"] = row["status"] == "optimal"
    row["equal"] = row["rows"] == row["optimum"]
    if row["proved"] and not row["equal"]:
        print(f"BUG: {rec['name']} proved {row['rows']} but the optimum is {row['optimum']}", file=sys.stderr)
    return row


def lp_instance(rec: dict, time_limit: float) -> dict:
    """The certified Gilmore–Gomory bound of one instance (column generation to convergence)."""
    sizes = np.asarray(rec["sizes"], dtype=np.int64)
    C = int(rec["capacity"])
    w, b, _ = types_of(sizes)
    lp = gilmore_gomory(w, b, C, time_limit=time_limit, stop_at_ceiling=False)
    bound = dual_bound(sizes, C, w, lp.u_M)[0] if lp.U > 0 else 0
    return {"name": rec["name"], "optimum": int(rec["optimum"]), "lb_l2": int(rec["lb_l2"]), "lp_bound": int(bound),
            "lp_value": float(lp.lp_value), "converged": bool(lp.converged), "iterations": lp.iterations,
            "seconds": lp.seconds}


def summarize_lp(rows_by_set: dict[str, list[dict]], time_limit: float) -> str:
    """Markdown: per set, how often the certified ⌈LP⌉ equals the optimum, against L2."""
    t = report.Table(["set", "instances", "LP converged", "⌈LP⌉ = optimum", "⌈LP⌉ = optimum − 1",
                      "⌈LP⌉ < optimum − 1", "L2 = optimum", "mean s", "max s"],
                     formats={"mean s": ".2f", "max s": ".2f"})
    for name, rows in rows_by_set.items():
        if not rows:
            continue
        gap = np.array([r["optimum"] - r["lp_bound"] for r in rows])
        secs = np.array([r["seconds"] for r in rows])
        t.add(name, len(rows), sum(r["converged"] for r in rows), int((gap == 0).sum()), int((gap == 1).sum()),
              int((gap > 1).sum()), sum(r["lb_l2"] == r["optimum"] for r in rows), secs.mean(), secs.max())
    off = [r for rows in rows_by_set.values() for r in rows if r["lp_bound"] != r["optimum"]]
    lines = ["# Certified Gilmore–Gomory LP bound on the 1D bin-packing benchmarks", "",
             f"`python experiments/bpp_certify.py --lp-bound --time-limit {time_limit:g}`: column generation "
             "alone per instance (`models.colgen.gilmore_gomory`, run until no column prices out or the time "
             "limit), its bound re-derived from the integer duals by `core.bounds.dual_bound` (exact arithmetic). "
             "Seconds on a shared 2-core machine.", "", *t.lines()]
    if off:
        lines += ["", "Instances with ⌈LP⌉ ≠ optimum:", "",
                  *report.table(["instance", "optimum", "⌈LP⌉ (certified)", "LP value", "converged", "seconds"],
                                [(r["name"], r["optimum"], r["lp_bound"], r["lp_value"], r["converged"], r["seconds"])
                                 for r in off], formats={"LP value": ".4f", "seconds": ".2f"})]
    return "\n".join(lines) + "\n"


def summarize(rows_by_set: dict[str, list[dict]], time_limit: float, workers: int) -> str:
    """The markdown of the per-instance records (the JSON lines), grouped by set in run order."""
    lines = [
        "# R* certifier on 1D bin-packing benchmarks",
        "",
        f"`python experiments/bpp_certify.py --time-limit {time_limit:g} --workers {workers}`: "
        "`certify_rows` with D=1 (R* = bin-packing optimum), each instance against its known "
        "optimum ($ROUTEPACK_BPP_DIR). *proved* = status `optimal`; *equal* = rows equal to the "
        "known optimum; *proved & equal* is the success criterion. Methods: `bounds` = L1/L2/DFF "
        "lower bound met by FFD/BFD, MBS' or the overflow tabu search; `colgen` = the certified Gilmore–Gomory LP bound "
        "(column generation), the LP-guided search (diving, restricted master IP, CP-SAT residual) and/or branch-and-price on K decided; "
        "`arcflow` = arc-flow MILP (Pyomo + HiGHS); `cpsat` = CP-SAT. Seconds are wall time per instance on a shared 2-core machine.",
        "",
    ]
    summary = report.Table(["set", "instances", "proved optimal", "equal to known", "proved & equal", "by method",
                            "mean s", "max s"], formats={"mean s": ".2f", "max s": ".2f"})
    tot = Counter()
    for name, rows in rows_by_set.items():
        if not rows:
            continue
        n = len(rows)
        proved = sum(r["proved"] for r in rows)
        equal = sum(r["equal"] for r in rows)
        both = sum(r["proved"] and r["equal"] for r in rows)
        meth = Counter(r["method"] for r in rows if r["proved"])
        secs = np.array([r["seconds"] for r in rows])
        by = ", ".join(f"{k} {v}" for k, v in sorted(meth.items()))
        summary.add(name, n, proved, equal, f"{both} ({100 * both / n:.1f}%)", by, secs.mean(), secs.max())
        tot.update(n=n, proved=proved, equal=equal, both=both)
        if name in TARGET:
            tot.update(tn=n, tboth=both)
    if tot["n"]:
        summary.add("**total**", tot["n"], tot["proved"], tot["equal"],
                    f"{tot['both']} ({100 * tot['both'] / tot['n']:.1f}%)", "", "", "")
    lines += summary.lines()
    if tot["tn"]:
        lines += ["", f"Falkenauer + Scholl + Schwerin + Wäscher: {tot['tboth']} / {tot['tn']} proved "
                  f"equal to the known optimum ({100 * tot['tboth'] / tot['tn']:.1f}%)."]
    misses = [r for rows in rows_by_set.values() for r in rows if not (r["proved"] and r["equal"])]
    if misses:
        lines += ["", "Not proved within the limit (rows = best known, lower bound = proved):", "",
                  *report.table(["instance", "n", "C", "optimum", "rows", "lower bound", "status", "seconds", "note"],
                                [(r["name"], r["n"], r["capacity"], r["optimum"], r["rows"],
                                  r["lower_bound"], r["status"], r["seconds"], r["detail"]) for r in misses],
                                formats={"seconds": ".1f"})]
    hard = rows_by_set.get("hard28") or []
    if hard:
        lines += ["", "Hard28 per instance:", "",
                  *report.table(["instance", "optimum", "rows", "status", "method", "seconds"],
                                [(r["name"], r["optimum"], r["rows"], r["status"], r["method"], r["seconds"])
                                 for r in hard], formats={"seconds": ".2f"})]
    return "\n".join(lines) + "\n"


def by_set(records: list[dict], sets=SETS) -> dict[str, list[dict]]:
    """The JSON-lines records grouped by their set, in ``sets`` order (how ``main`` runs them)."""
    return {name: [r for r in records if r.get("set") == name] for name in sets}


def _selected(path: Path, only) -> list[dict]:
    """The instances of one set's JSON lines; with ``only``, those named one of them (the full
    name, or its part after the set's prefix: ``BPP14`` is ``Hard28_BPP14``, not ``Hard28_BPP144``)."""
    recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return recs if not only else [r for r in recs if any(r["name"] in (o, r["name"].split("_", 1)[0] + "_" + o)
                                                         for o in only)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", nargs="*", default=SETS, choices=SETS)
    ap.add_argument("--limit", type=int, default=None, help="first K instances of each set")
    ap.add_argument("--only", nargs="*", default=None, metavar="NAME",
                    help="only these instances (full name, or without the set prefix: BPP14 TEST0022)")
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds per instance")
    ap.add_argument("--workers", type=int, default=2, help="CP-SAT workers")
    here = settings.RESULTS / "bpp_certify"
    ap.add_argument("--out", type=Path, default=here / "bpp_certify.md")
    ap.add_argument("--jsonl", type=Path, default=None, help="per-instance results (default: OUT with .jsonl)")
    ap.add_argument("--lp-bound", action="store_true",
                    help="the certified LP bound alone vs the optimum (writes lp_bound.md / .jsonl)")
    ap.add_argument("--render", action="store_true",
                    help="only rewrite the markdown from the JSON lines already there (no data needed)")
    args = ap.parse_args(argv)
    if args.render:
        jsonl = args.jsonl or args.out.with_suffix(".jsonl")
        records = [json.loads(x) for x in jsonl.read_text().splitlines() if x.strip()]
        report.write_text(args.out, summarize(by_set(records, args.sets), args.time_limit, args.workers))
        print(f"wrote {args.out}")
        return 0
    if not DATA.is_dir():
        ap.error(f"BPP benchmark set not found at {DATA}: set ROUTEPACK_BPP_DIR to its directory")
    warm(("plan", "exact"))  # as `routepack certify`: kernels compiled or loaded before any clock starts
    if args.lp_bound:
        out = args.out if args.out != here / "bpp_certify.md" else here / "lp_bound.md"
        jsonl = args.jsonl or out.with_suffix(".jsonl")
        done = {}
        if jsonl.exists():
            done = {r["name"]: r for r in map(json.loads, jsonl.read_text().splitlines()) if r}
        rows_by_set = {}
        with jsonl.open("a") as fh:
            for name in args.sets:
                recs = _selected(DATA / f"{name}.jsonl", args.only)
                rows_by_set[name] = []
                for rec in recs[: args.limit]:
                    row = done.get(rec["name"])
                    if row is None:
                        row = {**lp_instance(rec, args.time_limit), "set": name}
                        fh.write(json.dumps(row) + "\n")
                        fh.flush()
                    rows_by_set[name].append(row)
                report.write_text(out, summarize_lp(rows_by_set, args.time_limit))
        print(summarize_lp(rows_by_set, args.time_limit))
        return 0
    jsonl = args.jsonl or args.out.with_suffix(".jsonl")
    done: dict[str, dict] = {}
    if jsonl.exists():
        for line in jsonl.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done[r["name"]] = r
    rows_by_set: dict[str, list[dict]] = {}
    with jsonl.open("a") as fh:
        for name in args.sets:
            rows_by_set[name] = []
            recs = _selected(DATA / f"{name}.jsonl", args.only)
            for rec in recs[: args.limit]:
                if rec["name"] in done:
                    rows_by_set[name].append(done[rec["name"]])
                    continue
                row = run_instance(rec, args.time_limit, args.workers)
                row["set"] = name
                fh.write(json.dumps(row) + "\n")
                fh.flush()
                rows_by_set[name].append(row)
                print(f"{name} {row['name']}: rows {row['rows']} (opt {row['optimum']}) {row['status']} "
                      f"{row['method']} {row['seconds']:.2f}s", flush=True)
            report.write_text(args.out, summarize(rows_by_set, args.time_limit, args.workers))
    print(summarize(rows_by_set, args.time_limit, args.workers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
