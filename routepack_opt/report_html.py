"""The replay report's outputs from its step lines (:mod:`routepack_opt.report_run`):
``summary.json`` (the run's answer in seconds: predicted saving less measured planning) and the
self-contained ``report.html`` (headline, options, plots as base64 PNGs, tables). Re-exported by
:mod:`routepack_opt.report_run`."""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from routepack_opt.core import inputs
from routepack_opt.core.errors import InputError
from routepack_opt.core.io import atomic_write_bytes, atomic_write_text

__all__ = ["SUMMARY", "run_summary", "write_summary", "summarize", "render_report"]

SUMMARY = "summary.json"


def _natural_key(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


# ---------------------------------------------------------------------------------------------
# summary.json: the run's answer in seconds
# ---------------------------------------------------------------------------------------------


def _step_seconds(rec: dict) -> tuple[float, float]:
    """(predicted seconds saved against the step's best cap-keeping baseline, measured planning
    seconds: R* certification and the plan) of one step line; (0, planning) without a baseline."""
    t = rec.get("timings", {})
    planning = float(t.get("certify", 0.0)) + float(t.get("plan", 0.0))
    best = rec.get("best_baseline")
    if best is None or "error" in rec:
        return 0.0, planning
    b = rec["baselines"][best]
    if b.get("cap_violations", 0):
        raise InputError(f"{rec['window']}: best baseline {best} breaks the cap")
    return (float(b["makespan"]) - float(rec["makespan"])) / 1e6, planning


def run_summary(records: Iterable[dict], options: dict | None = None) -> dict:
    """The run in seconds: ``windows``; ``seconds_saved`` (predicted, Σ over the steps of the best
    cap-keeping baseline's makespan − ours); ``planning_seconds`` (measured: R* and the plan, per
    window, summed); ``net_seconds_saved`` = the difference; ``options`` (every option of the
    run) and ``budget`` (the search budget in words, :meth:`ReportConfig.budget`); the percentages
    of :func:`summarize` beside them."""
    recs = list(records)
    saved = planning = 0.0
    for r in recs:
        a, b = _step_seconds(r)
        saved += a
        planning += b
    s = summarize(recs)
    return {"windows": s["windows"], "ok": s["ok"], "failed": s["failed"], "seconds_saved": saved,
            "planning_seconds": planning, "net_seconds_saved": saved - planning,
            "mean_saving": s["mean_saving"], "median_saving": s["median_saving"], "rows_saved": s["rows_saved"],
            "budget": (options or {}).get("budget"), "options": dict(options or {})}


def write_summary(out_dir, records: Iterable[dict], options: dict | None = None) -> Path:
    """Write ``OUT_DIR/summary.json`` (:func:`run_summary`) atomically."""
    from routepack_opt.core.plan import dumps_strict

    path = Path(out_dir) / SUMMARY
    atomic_write_text(path, dumps_strict(run_summary(records, options), indent=1, sort_keys=True) + "\n")
    return path


def _options_html(options: dict | None) -> str:
    if not options:
        return ""
    esc = html.escape
    cells = "".join(f"<tr><td>{esc(str(k))}</td><td>{esc(json.dumps(v, sort_keys=True, default=str))}</td></tr>"
                    for k, v in options.items() if k != "params")
    return f"<h2>Options</h2><table id=options><tr><th>option</th><th>value</th></tr>{cells}</table>"


def _headline_html(records: list[dict], options: dict | None) -> str:
    rs = run_summary(records, options)
    red = (options or {}).get("redundant_experts")
    return (f"<p class=headline>Net saving over the run: <b id=net-seconds>{rs['net_seconds_saved']:+,.2f} s</b> "
            f"= {rs['seconds_saved']:,.2f} s predicted saved against each step's best cap-keeping baseline "
            f"− {rs['planning_seconds']:,.2f} s of planning (measured), over {rs['windows']} windows"
            + (f"; {red} redundant expert slots per layer" if red else "") + ".</p>")


# ---------------------------------------------------------------------------------------------
# report.html
# ---------------------------------------------------------------------------------------------


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _fmt_pct(x) -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{100 * x:+.2f}%"


def summarize(records: Iterable[dict]) -> dict:
    """Aggregates shown in the report (and printed by the CLI)."""
    ok = [r for r in records if "error" not in r]
    sav = np.array([r["saving"] for r in ok if r.get("saving") is not None], dtype=np.float64)
    names = sorted({k for r in ok for k in r["baselines"]})
    per = {}
    for n in names:
        bs = [(r["baselines"][n], r) for r in ok if n in r["baselines"] and "makespan" in r["baselines"][n]]
        if not bs:
            continue
        per[n] = {"windows": len(bs), "mean_saving": float(np.mean([b["saving"] for b, _ in bs])),
                  "cap_violations": int(sum(b["cap_violations"] for b, _ in bs)),
                  "windows_over_cap": int(sum(b["cap_violations"] > 0 for b, _ in bs)),
                  "extra_rows": int(sum(b["extra_rows"] for b, _ in bs)),
                  "mean_gap": float(np.mean([b["gap"] for b, _ in bs]))}
    return {"windows": len(ok) + sum("error" in r for r in records), "ok": len(ok),
            "failed": sum("error" in r for r in records),
            "mean_saving": float(sav.mean()) if sav.size else None,
            "median_saving": float(np.median(sav)) if sav.size else None,
            "min_saving": float(sav.min()) if sav.size else None,
            "max_saving": float(sav.max()) if sav.size else None,
            "rows_saved": int(sum(r["rows_saved"] for r in ok if r.get("rows_saved") is not None)),
            "mean_gap": float(np.mean([r["gap"] for r in ok])) if ok else None,
            "baselines": per}


def render_report(records: list[dict], path, *, title: str = "", windows: list[str] | None = None,
                  options: dict | None = None, notes: list[str] | None = None) -> Path:
    """Write the self-contained ``report.html`` (plots as base64 PNGs) for ``records``: the net
    seconds first, then the search budget and the options (``options``:
    :meth:`ReportConfig.options`), the notes (``notes``: the ``steps.jsonl`` lines left out, see
    :func:`routepack_opt.report_run.read_steps`), the plots and the tables."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = {w: k for k, w in enumerate(windows or [])}
    recs = sorted(records, key=lambda r: (order.get(r["window"], len(order)), _natural_key(r["window"])))
    ok = [r for r in recs if "error" not in r]
    s = summarize(recs)
    figs = _figures(plt, ok, s) if ok else []
    path = Path(path)
    doc = _report_html(recs, s, figs, title, options, notes or [])
    atomic_write_bytes(path, doc.encode("utf-8", "backslashreplace"))  # any name's bytes: still UTF-8
    return path


def _figures(plt, ok: list[dict], s: dict) -> list[tuple[str, str]]:
    """The report's plots of the planned windows ``ok`` (summary ``s``): (title, base64 PNG)."""
    x = np.arange(len(ok))
    figs = _saving_figures(plt, x, ok)
    packers = sorted({k.split("/")[0] for r in ok for k in r["baselines"]})
    fig, ax = plt.subplots(figsize=(10, 3.2))
    _rows_bars(ax, x, packers, ok)
    figs.append(("Rows saved", _png(fig)))
    figs.append(("Cap violations", _cap_violations_figure(plt, s)))
    figs.append(("Where the time goes (attention vs experts)", _time_split_figure(plt, ok)))
    figs.append(("Gap and EP-rank imbalance", _gap_figure(plt, x, ok)))
    return figs


def _saving_figures(plt, x, ok: list[dict]) -> list[tuple[str, str]]:
    """The saving per step and its distribution."""
    sav = np.array([np.nan if r.get("saving") is None else 100 * r["saving"] for r in ok])
    fig, ax = plt.subplots(figsize=(10, 3.2))
    ax.plot(x, sav, lw=1.2, color="tab:blue")
    ax.axhline(0, color="k", lw=0.6)
    ax.set(xlabel="step (window, in name order)", ylabel="saving %",
           title="Saving per step over the best cap-keeping baseline")
    figs = [("Saving per step", _png(fig))]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.hist(sav[np.isfinite(sav)], bins=min(40, max(5, len(ok) // 5)), color="tab:blue")
    ax.set(xlabel="saving %", ylabel="windows", title="Distribution of the saving")
    figs.append(("Distribution of the saving", _png(fig)))
    return figs


def _cap_violations_figure(plt, s: dict) -> str:
    """Each baseline's micro-batches over the cap, over all windows."""
    names = sorted(s["baselines"])
    fig, ax = plt.subplots(figsize=(10, 3.4))
    vals = [s["baselines"][n]["cap_violations"] for n in names]
    ax.bar(range(len(names)), vals, color="tab:red")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set(ylabel="micro-batches over the cap", title="Baselines' cap violations (all windows)")
    for k, v in enumerate(vals):
        ax.text(k, v, str(v), ha="center", va="bottom", fontsize=8)
    return _png(fig)


def _time_split_figure(plt, ok: list[dict]) -> str:
    """Attention / experts / overhead on the critical path: the plan's and the best baseline's."""
    fig, axs = plt.subplots(1, 2, figsize=(10, 3.2), sharey=True)
    for ax, key, label in ((axs[0], "time_split", "RoutePack plan"),
                           (axs[1], "time_split_best_baseline", "best cap-keeping baseline")):
        rs = [r for r in ok if key in r]
        xs = np.arange(len(rs))
        a = np.array([r[key]["attention"] for r in rs]) / 1e3
        e = np.array([r[key]["experts"] for r in rs]) / 1e3
        o = np.array([r[key]["overhead"] for r in rs]) / 1e3
        ax.stackplot(xs, a, e, o, labels=["attention", "experts", "overhead"],
                     colors=["tab:orange", "tab:green", "tab:gray"])
        ax.set(xlabel="step", title=f"Critical path: {label}")
    axs[0].set_ylabel("ms")
    axs[0].legend(fontsize=8, loc="lower left")
    return _png(fig)


def _gap_figure(plt, x, ok: list[dict]) -> str:
    """The plan's gap to the lower bound and the EP-rank imbalance of each placement."""
    fig, axs = plt.subplots(1, 2, figsize=(10, 3.2))
    axs[0].plot(x, [r["gap"] for r in ok], lw=1)
    axs[0].set(xlabel="step", ylabel="makespan / LB", title="Gap to the lower bound (RoutePack)")
    for k in ("identity", "eplb", "routepack"):
        axs[1].plot(x, [r["ep_imbalance"][k] for r in ok], lw=1, label=k)
    axs[1].set(xlabel="step", ylabel="CV of EP-rank loads", title="EP-rank imbalance")
    axs[1].legend(fontsize=8)
    return _png(fig)


def _r_star(r: dict):
    """R* of a step line: its certificate's rows (the row search's R* where that is missing)."""
    cert = r.get("certificate") or {}
    return cert.get("rows") if cert.get("rows") is not None else (r.get("row_search") or {}).get("r_star")


def _report_html(recs: list[dict], s: dict, figs: list[tuple[str, str]], title: str, options: dict | None,
                 notes: list[str]) -> str:
    """The report's page: headline, budget, options, notes, the baselines' table, the plots, the
    steps' table."""
    esc = html.escape
    rows_html = "".join(
        f"<tr><td>{esc(n)}</td><td>{b['windows']}</td><td>{_fmt_pct(b['mean_saving'])}</td>"
        f"<td>{b['cap_violations']}</td><td>{b['windows_over_cap']}</td><td>{b['extra_rows']}</td>"
        f"<td>{b['mean_gap']:.4f}</td></tr>" for n, b in sorted(s["baselines"].items()))
    steps_html = "".join(
        f"<tr><td>{esc(inputs.display_name(r['window']))}</td>" + (
            f"<td colspan=7 class=err>{esc(r['error'])}</td>" if "error" in r else
            f"<td>{r['rows']}</td><td>{'–' if _r_star(r) is None else _r_star(r)}</td>"
            f"<td>{r['makespan'] / 1e3:,.2f}</td><td>{r['lower_bound'] / 1e3:,.2f}</td>"
            f"<td>{r['gap']:.4f}</td><td>{esc(str(r['best_baseline']))}</td><td>{_fmt_pct(r['saving'])}</td>")
        + "</tr>" for r in recs)
    summary = (f"<p>{s['windows']} windows, {s['ok']} planned, {s['failed']} failed. Saving over the best "
               f"cap-keeping baseline: mean <b id=mean-saving>{_fmt_pct(s['mean_saving'])}</b>, median "
               f"{_fmt_pct(s['median_saving'])}, min {_fmt_pct(s['min_saving'])}, max {_fmt_pct(s['max_saving'])}; "
               f"rows saved in all: <b>{s['rows_saved']}</b>; mean gap to the lower bound "
               f"{'–' if s['mean_gap'] is None else format(s['mean_gap'], '.4f')}.</p>")
    budget = (f"<p id=budget>Search budget: {esc(str(options['budget']))}.</p>"
              if options and options.get("budget") else "")
    notes_html = ("<h2>Notes</h2><ul id=notes>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>"
                  if notes else "")
    imgs = "".join(f"<h2>{esc(t)}</h2><img alt='{esc(t)}' src='data:image/png;base64,{b}'>" for t, b in figs)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>RoutePack replay report</title>
<style>body{{font-family:sans-serif;margin:1.5em;max-width:1100px}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}td:first-child{{text-align:left}}
.err{{color:#b00;text-align:left}}img{{max-width:100%}}.headline{{font-size:20px}}</style></head><body>
<h1>RoutePack replay report</h1>{_headline_html(recs, options)}<p>{esc(inputs.display_name(title))}</p>{summary}
{budget}{_options_html(options)}{notes_html}
<p>Saving = (best cap-keeping baseline − RoutePack) / best, every layout scored by RoutePack's one evaluator.
Baselines: each framework's own packer at the rows it picks, under identity or EPLB placement
(cap violations: micro-batches over the token cap; extra rows: rows − R*).</p>
<h2>Baselines (all windows)</h2><table><tr><th>baseline</th><th>windows</th><th>mean saving vs it</th>
<th>cap violations</th><th>windows over cap</th><th>extra rows</th><th>mean gap to LB</th></tr>{rows_html}</table>
{imgs}
<h2>Steps</h2><table><tr><th>window</th><th>rows</th><th>R*</th><th>makespan ms</th><th>LB ms</th><th>gap</th>
<th>best baseline</th><th>saving</th></tr>{steps_html}</table></body></html>
"""


def _rows_bars(ax, x, packers: list[str], ok: list[dict]) -> None:
    """Rows each framework uses beyond our plan per step (its rows − ours: the rows saved), as
    grouped bars (integer, mostly 0/1: a line between steps would draw values that do not exist)."""
    width = 0.8 / max(1, len(packers))
    top = 0.0
    for j, p in enumerate(packers):
        key = f"{p}/identity"
        ys = np.array([r["baselines"].get(key, {}).get("rows", np.nan) - r["rows"] for r in ok], dtype=np.float64)
        ys = np.nan_to_num(ys)
        top = max(top, float(ys.max(initial=0.0)))
        ax.bar(x - 0.4 + (j + 0.5) * width, ys, width=width, label=p)
    ax.set_ylim(top=max(1.0, top) * 1.4)  # room for the legend above the bars
    ax.set(xlabel="step", ylabel="baseline rows − our rows",
           title="Rows saved: micro-batches each framework uses beyond our plan")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=8, ncol=3)
