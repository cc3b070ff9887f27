"""Hostile-input fuzzing, shared by the property tests (tests/test_fuzz_inputs.py, short profile)
and the sweeps in experiments/ (long profile, hostile_sweep_r4.py).

:func:`good_files` writes one good file of every format the package reads; :func:`mutate` turns
one into a hostile variant (truncation, bit flips, spliced bytes, dtype and shape changes in the
array headers, JSON values of the wrong type or range, special files, odd names);
:func:`run_case` runs a reader on it in-process under a timeout and classifies the outcome:

- ``ok``: exit 0 (or the API call returned) and, for a command with an output, a readable output;
- ``clean2``: exit 2 with exactly one ``error:`` line on stderr (an ``InputError`` for the API);
- ``exit1``: an internal failure; ``traceback``: any other exception escaped or a traceback was
  printed; ``hang``: the timeout fired; ``noise``: stderr held more than the one line (warnings);
- ``changed``: an input file, or the old output of a failed run, is not as it was (data loss);
  ``leftover``: a temporary file was left beside the output.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import signal
import socket
import zipfile
from pathlib import Path

import numpy as np

from routepack_opt.core.errors import InputError

N, L, E, K = 16, 2, 8, 2
COST = "olmoe-1b-7b"
TOPO = ["--dp", "2", "--ep", "2", "--capacity", "1024"]


class Hang(BaseException):
    """The case's timeout fired (a BaseException: no ``except Exception`` of ours swallows it)."""


def _window_arrays(seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(20, 200, N).astype(np.int64)
    counts = np.zeros((N, L, E), dtype=np.int32)
    routes = []
    for i in range(N):
        r = np.stack([np.stack([rng.choice(E, K, replace=False) for _ in range(L)]) for _ in range(lengths[i])])
        routes.append(r)
        for l in range(L):
            counts[i, l] = np.bincount(r[:, l, :].ravel(), minlength=E)
    return lengths, counts, np.concatenate(routes).astype(np.int64)


def _report_config():
    from routepack_opt.core.cost import resolve_cost
    from routepack_opt.core.topology import Topology
    from routepack_opt.report_run import ReportConfig

    return ReportConfig(topology=Topology(dp=2, ep=2, capacity=1024), cost=resolve_cost(COST))


def good_files(d: Path) -> dict[str, Path]:
    """One good file per format: window .npz, plan .json, cost and config .toml, routes
    .npz/.npy/.pt/.safetensors (+ lengths .npy), run.json and steps.jsonl."""
    from routepack_opt.core.cost import PRESETS, save_cost
    from routepack_opt.core.layout import Layout
    from routepack_opt.core.plan import Plan
    from routepack_opt.core.topology import Topology
    from routepack_opt.core.window import Window, save_window

    d.mkdir(parents=True, exist_ok=True)
    lengths, counts, routes = _window_arrays()
    files = {}
    save_window(Window(lengths, counts, top_k=K), d / "w.npz")
    files["window"] = d / "w.npz"
    topo = Topology(dp=2, ep=2, capacity=1024)
    order = np.argsort(-lengths)
    row = np.zeros(N, dtype=np.int64)
    slot = np.zeros(N, dtype=np.int64)
    row[order] = (np.arange(N) // 2) % 2
    slot[order] = np.arange(N) % 2
    plan = Plan.from_layout(topo, np.tile(np.arange(E), (L, 1)), Layout(row, slot, 2), "max-sum")
    plan.save(d / "p.json")
    files["plan"] = d / "p.json"
    rep = json.loads((d / "p.json").read_text())
    rep["topology"]["redundant_experts"] = 2
    rep["phy2log"] = [list(range(E)) + [0, 1] for _ in range(L)]
    rep["logcnt"] = [[2, 2] + [1] * (E - 2) for _ in range(L)]
    (d / "p_rep.json").write_text(json.dumps(rep))
    files["plan_rep"] = d / "p_rep.json"
    save_cost(PRESETS[COST].cost, d / "c.toml")
    files["cost"] = d / "c.toml"
    (d / "cfg.toml").write_text("[anneal]\npopulation = 4\n[certify]\ntime_limit = 1.0\n")
    files["config"] = d / "cfg.toml"
    np.savez(d / "r.npz", routes=routes, lengths=lengths)
    files["routes_npz"] = d / "r.npz"
    np.save(d / "r.npy", routes)
    np.save(d / "len.npy", lengths)
    files["routes_npy"] = d / "r.npy"
    files["lengths"] = d / "len.npy"
    try:
        import torch

        torch.save({"routes": torch.from_numpy(routes), "lengths": torch.from_numpy(lengths)}, d / "r.pt")
        files["routes_pt"] = d / "r.pt"
    except ImportError:
        pass
    try:
        from safetensors.numpy import save_file

        save_file({"routes": routes, "lengths": lengths}, str(d / "r.safetensors"))
        files["routes_st"] = d / "r.safetensors"
    except ImportError:
        pass
    rec = {"window": "step_0.npz", "step": 0, "rows": 2, "makespan": 10.0, "lower_bound": 9.0, "gap": 1.1,
           "saving": 1 / 11, "rows_saved": 0, "best_baseline": "a/identity",
           "baselines": {"a/identity": {"makespan": 11.0, "saving": 1 / 11, "gap": 1.2, "cap_violations": 0,
                                        "extra_rows": 0, "rows": 2}, "b/eplb": {"error": "x"}},
           "ep_imbalance": {"routepack": 0.1, "identity": 0.2, "eplb": 0.15},
           "time_split": {"attention": 1.0, "experts": 2.0, "overhead": 0.5}}
    (d / "steps.jsonl").write_text(json.dumps(rec) + "\n" + json.dumps({"window": "step_1.npz", "error": "e"}) + "\n")
    files["steps"] = d / "steps.jsonl"
    (d / "run.json").write_text(json.dumps(_report_config().fingerprint(), sort_keys=True) + "\n")
    files["run_json"] = d / "run.json"
    return files


# --- mutations ---------------------------------------------------------------------------------
BYTE_MUTATIONS = ("truncate", "flip", "splice", "zero_tail", "empty", "duplicate")
ARRAY_MUTATIONS = ("dtype", "shape", "member_method", "member_encrypted", "member_crc", "member_missing")
JSON_MUTATIONS = ("json_type", "json_range", "json_drop", "json_wrap", "json_nan", "json_deep")
SPECIAL = ("fifo", "dir", "dangling", "loop", "devzero", "socket", "long_name", "nonutf8_name", "noperm")
BAD_DTYPES = ("?", "c8", "<U3", "M8[s]", "V8", "f2", "u8", ">i4", "i1", "O", "f8")


def _npy_bytes(arr) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asanyarray(arr), allow_pickle=True)
    return buf.getvalue()


def _rewrite_npz(src: Path, dst: Path, fn) -> None:
    """Copy the .npz with ``fn(name, bytes, info) -> (bytes, info) | None`` applied to its members."""
    with zipfile.ZipFile(src) as zin:
        items = [(i, zin.read(i)) for i in zin.infolist()]
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info, data in items:
            out = fn(info.filename, data, info)
            if out is None:
                continue
            zout.writestr(out[1], out[0])


def _with_dtype(arr: np.ndarray, dt: str):
    if dt == "O":
        return np.array([np.asarray(x) for x in arr.reshape(arr.shape[0], -1)] + [None], dtype=object)
    if dt == "<U3":
        return arr.astype(str).astype("<U3")
    if dt == "M8[s]":
        return arr.astype("M8[s]")
    if dt == "V8":
        return np.frombuffer(np.ascontiguousarray(arr, dtype=np.int64).tobytes(), dtype="V8")
    with np.errstate(all="ignore"):
        return arr.astype(dt)


def _header_shape(data: bytes, rng: random.Random) -> bytes:
    """An .npy with its header's shape replaced (negative, huge, wrong rank, overflowing)."""
    new = rng.choice(["(-1, 2, 2)", "(2**70,)", "(4611686018427387904, 8)", "()", "(1, 2, 3, 4)",
                      "(0,)", "(99999999, 99999999)", "('a',)", "(1.5,)", "(-9223372036854775808,)"])
    head_end = data.index(b"\n") + 1
    head = data[:head_end]
    start = head.index(b"'shape': ") + len(b"'shape': ")
    stop = head.index(b"), ", start) + 1
    body = head[:start] + new.encode() + head[stop:]
    # keep numpy's padding rule: the header length field is rewritten, data follows
    text = body[10:] if data[6:8] == b"\x01\x00" else body[12:]
    text = text.rstrip(b"\n").rstrip(b" ")
    pad = (64 - (len(text) + 11) % 64) % 64
    text = text + b" " * pad + b"\n"
    if data[6:8] == b"\x01\x00":
        if len(text) >= 65536:
            return data
        return data[:8] + len(text).to_bytes(2, "little") + text + data[head_end:]
    return data[:8] + len(text).to_bytes(4, "little") + text + data[head_end:]


def _json_mutate(obj, rng: random.Random, kind: str):
    """A copy of ``obj`` with one integer (or list, or key) replaced per ``kind``."""
    paths = []

    def walk(x, p):
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, p + [k])
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, p + [i])
        if p:
            paths.append((p, x))

    walk(obj, [])
    obj = json.loads(json.dumps(obj))
    if kind == "json_wrap":
        return [obj]
    if kind == "json_deep":
        return "__DEEP__"
    if not paths:
        return obj
    p, old = rng.choice(paths)
    parent = obj
    for k in p[:-1]:
        parent = parent[k]
    if kind == "json_drop" and isinstance(parent, dict):
        parent.pop(p[-1])
        return obj
    if kind == "json_type":
        new = rng.choice(["1", 1.5, True, None, [], {}, 1.0, "x", [[1]]])
    elif kind == "json_range":
        new = rng.choice([-1, 2**31, 2**63, 2**64, -2**63, 10**30, 0, 7])
    else:  # json_nan: written below as a bare NaN token
        new = "__NAN__"
    parent[p[-1]] = new
    return obj


def mutate(src: Path, dst_dir: Path, kind: str, seed: int) -> Path:
    """A hostile variant of ``src`` in ``dst_dir`` (its name depends on ``kind``)."""
    rng = random.Random(seed)
    data = src.read_bytes()
    name = src.name
    dst = dst_dir / name
    if kind == "long_name":
        dst = dst_dir / ("x" * 300 + src.suffix)
        return dst  # never created: the name itself is the hostile input
    if kind == "nonutf8_name":
        dst = Path(os.fsdecode(os.fsencode(str(dst_dir)) + b"/\xff\xfe-" + os.fsencode(name)))
        dst.write_bytes(data)
        return dst
    if kind == "fifo":
        os.mkfifo(dst)
        return dst
    if kind == "dir":
        dst.mkdir()
        return dst
    if kind == "dangling":
        dst.symlink_to(dst_dir / "missing-target")
        return dst
    if kind == "loop":
        dst.symlink_to(dst)
        return dst
    if kind == "devzero":
        dst.symlink_to("/dev/zero")
        return dst
    if kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        with contextlib.suppress(OSError):
            s.bind(str(dst))
        s.close()
        return dst
    if kind == "noperm":
        dst.write_bytes(data)
        dst.chmod(0)
        return dst
    if kind == "truncate":
        data = data[:rng.randrange(0, max(1, len(data)))]
    elif kind == "flip":
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        data = bytes(b)
    elif kind == "splice":
        i = rng.randrange(len(data) + 1)
        data = data[:i] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))) + data[i:]
    elif kind == "zero_tail":
        i = rng.randrange(len(data))
        data = data[:i] + b"\0" * (len(data) - i)
    elif kind == "empty":
        data = b""
    elif kind == "duplicate":
        data = data + data
    elif kind == "dtype" and src.suffix in (".pt", ".safetensors"):
        import torch

        r = torch.from_numpy(np.load(src.with_name("r.npy")))
        ln = torch.from_numpy(np.load(src.with_name("len.npy")))
        choice = rng.choice(["bfloat16", "float8_e4m3fn", "float8_e5m2", "float16", "bool", "complex64",
                             "uint8", "sparse", "int8", "float64"])
        if choice == "sparse":
            t = r.to_sparse()
        else:
            t = r.to(getattr(torch, choice))
        if src.suffix == ".pt":
            torch.save({"routes": t, "lengths": ln}, dst)
        else:
            from safetensors.torch import save_file

            save_file({"routes": t if choice not in ("sparse", "complex64") else r.to(torch.bool),
                       "lengths": ln}, str(dst))
        return dst
    elif kind in ARRAY_MUTATIONS and src.suffix == ".npy":
        arr = np.load(src)
        if kind == "dtype":
            data = _npy_bytes(_with_dtype(arr, rng.choice(BAD_DTYPES)))
        elif kind == "shape":
            data = _header_shape(data, rng)
        else:
            data = data[:rng.randrange(len(data))]
    elif kind in ARRAY_MUTATIONS and src.suffix == ".npz":
        target = rng.choice(["counts", "lengths", "routes", "top_k"])

        def fn(member, raw, info):
            if not member.startswith(target):
                return raw, info
            if kind == "member_missing":
                return None
            if kind == "dtype":
                arr = np.load(io.BytesIO(raw))
                return _npy_bytes(_with_dtype(np.atleast_1d(arr), rng.choice(BAD_DTYPES))), info
            if kind == "shape":
                return _header_shape(raw, rng), info
            return raw, info

        _rewrite_npz(src, dst, fn)
        raw = bytearray(dst.read_bytes())
        if kind in ("member_method", "member_encrypted", "member_crc"):
            # patch the local and central headers of the first member of ``target``
            with zipfile.ZipFile(dst) as z:
                infos = [i for i in z.infolist() if i.filename.startswith(target)] or z.infolist()[:1]
            info = infos[0]
            off = info.header_offset
            central = [m for m in _find_all(raw, b"PK\x01\x02")]
            cen = next((c for c in central if raw[c + 46:c + 46 + len(info.filename)] == info.filename.encode()), None)
            if kind == "member_method":
                m = rng.choice([99, 12, 14, 93, 1])
                raw[off + 8:off + 10] = m.to_bytes(2, "little")
                if cen is not None:
                    raw[cen + 10:cen + 12] = m.to_bytes(2, "little")
            elif kind == "member_encrypted":
                raw[off + 6] |= 1
                if cen is not None:
                    raw[cen + 8] |= 1
            else:
                data_start = off + 30 + int.from_bytes(raw[off + 26:off + 28], "little") + \
                    int.from_bytes(raw[off + 28:off + 30], "little")
                k = data_start + rng.randrange(max(1, info.compress_size))
                if k < len(raw):
                    raw[k] ^= 0xFF
        dst.write_bytes(bytes(raw))
        return dst
    elif kind in JSON_MUTATIONS and src.suffix in (".json", ".jsonl"):
        lines = data.decode().splitlines() if src.suffix == ".jsonl" else [data.decode()]
        k = rng.randrange(len(lines))
        new = json.dumps(_json_mutate(json.loads(lines[k]), rng, kind))
        new = new.replace('"__DEEP__"', "[" * rng.choice([50, 5000, 100000]) + "1" + "]" * 3)
        lines[k] = new.replace('"__NAN__"', rng.choice(["NaN", "Infinity", "-Infinity"]))
        data = ("\n".join(lines) + "\n").encode()
    else:  # a mutation that does not apply to the format: a bit flip
        return mutate(src, dst_dir, "flip", seed)
    dst.write_bytes(data)
    return dst


def _find_all(buf, sub):
    i = buf.find(sub)
    while i >= 0:
        yield i
        i = buf.find(sub, i + 1)


# --- running ------------------------------------------------------------------------------------
def _digest(p: Path) -> str | None:
    try:
        if p.is_symlink() or not p.is_file():
            return None
        return hashlib.sha256(p.read_bytes()).hexdigest()
    except OSError:
        return None


def snapshot(d: Path) -> dict[str, str | None]:
    return {n: _digest(d / n) for n in sorted(os.listdir(d))}


@contextlib.contextmanager
def time_limit(seconds: float):
    def fire(signum, frame):
        raise Hang

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_cli(argv: list[str], timeout: float = 20.0) -> tuple[str, int | None, str]:
    """``routepack ARGV`` in-process: (outcome, exit code, stderr)."""
    import warnings

    from routepack_opt.cli import main

    err, out = io.StringIO(), io.StringIO()
    try:
        with time_limit(timeout), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), \
                warnings.catch_warnings():
            warnings.simplefilter("default")  # a warning the CLI lets through is seen
            code = main(argv)
    except Hang:
        return "hang", None, err.getvalue()
    except BaseException as exc:  # noqa: BLE001 - any escape is the finding
        return "traceback", None, f"{exc.__class__.__name__}: {exc}"
    text = err.getvalue()
    lines = [x for x in text.splitlines() if x.strip()]
    if "Traceback" in text:
        return "traceback", code, text
    if code == 1:
        return "exit1", code, text
    if code == 2:
        if len(lines) == 1 and lines[0].startswith("error: "):
            return "clean2", code, text
        return "noise", code, text
    if code == 0:
        return ("ok" if not lines else "noise"), code, text
    return "traceback", code, text


def run_api(fn, timeout: float = 20.0) -> tuple[str, str]:
    """``fn()`` in-process: ``ok``, ``clean2`` (an InputError), ``traceback`` (anything else), ``hang``."""
    import warnings

    try:
        with time_limit(timeout), warnings.catch_warnings():
            warnings.simplefilter("error")  # the API may warn only where asked
            fn()
    except Hang:
        return "hang", ""
    except InputError as exc:
        msg = str(exc)
        return ("clean2" if msg and "\n" not in msg else "noise"), msg
    except BaseException as exc:  # noqa: BLE001
        return "traceback", f"{exc.__class__.__name__}: {exc}"
    return "ok", ""


def leftovers(d: Path) -> list[str]:
    return [n for n in os.listdir(d) if n.startswith(".") and n.endswith(".tmp")]


def reader_cases(files: dict[str, Path]):
    """(format, good file, how to read it) — ``read(path, workdir) -> (outcome, detail)``: the
    package's readers of each format, through the CLI where a cheap command reads it."""
    w, p = str(files["window"]), str(files["plan"])

    def cli(*args):
        def read(path, work):
            out = work / "out.npz"
            if not out.exists():
                out.write_bytes(b"old output\n")
            old = _digest(out)
            argv = [a.replace("{P}", str(path)).replace("{O}", str(out)) for a in args]
            outcome, code, err = run_cli(argv)
            if outcome != "ok" and _digest(out) != old:
                return "changed", f"output changed on {outcome}"
            if outcome == "ok" and "{O}" in args:
                from routepack_opt.core.window import load_window
                try:
                    load_window(out)
                except InputError as exc:
                    return "wrong", f"output unreadable: {exc}"
            return outcome, err
        return read

    def api(call):
        def read(path, work):
            return run_api(lambda: call(path, work))
        return read

    from routepack_opt.core.plan import load_plan
    from routepack_opt.params import PlannerParams
    from routepack_opt.report_run import read_steps

    def steps(path, work):
        read_steps(path)

    def run_json(path, work):
        from routepack_opt.report_run import prepare_out_dir
        out = work / "rep"
        out.mkdir(exist_ok=True)
        target = out / "run.json"
        if target.exists() or target.is_symlink():
            target.unlink()
        if os.path.lexists(path):
            os.link(path, target, follow_symlinks=False) if not Path(path).is_dir() else target.mkdir()
        prepare_out_dir(out, _report_config())

    rt = ["import-replay", "{P}", "--num-experts", str(E), "-o", "{O}"]
    cases = [
        ("window", files["window"], cli("stats", "{P}")),
        ("window", files["window"], cli("evaluate", "{P}", p, "--cost", COST)),
        ("plan", files["plan"], cli("evaluate", w, "{P}", "--cost", COST)),
        ("plan", files["plan_rep"], api(lambda q, _: load_plan(q, num_samples=N))),
        ("cost", files["cost"], cli("evaluate", w, p, "--cost", "{P}")),
        ("config", files["config"], api(lambda q, _: PlannerParams.from_toml(q))),
        ("routes_npz", files["routes_npz"], cli(*rt)),
        ("routes_npy", files["routes_npy"], cli(*rt, "--lengths", str(files["lengths"]))),
        ("lengths", files["lengths"], cli("import-replay", str(files["routes_npy"]), "--num-experts", str(E),
                                          "--lengths", "{P}", "-o", "{O}")),
        ("steps", files["steps"], api(steps)),
        ("run_json", files["run_json"], api(run_json)),
    ]
    if "routes_pt" in files:
        cases.append(("routes_pt", files["routes_pt"], cli(*rt)))
    if "routes_st" in files:
        cases.append(("routes_st", files["routes_st"], cli(*rt)))
    return cases


def mutations_for(fmt: str) -> tuple[str, ...]:
    if fmt in ("window", "routes_npz", "routes_npy", "lengths"):
        extra = ARRAY_MUTATIONS
    elif fmt in ("routes_pt", "routes_st"):
        extra = ("dtype",)
    elif fmt in ("plan", "steps", "run_json"):
        extra = JSON_MUTATIONS
    else:
        extra = ()
    return BYTE_MUTATIONS + extra + SPECIAL


def one_case(case, kind: str, seed: int, work: Path) -> tuple[str, str]:
    """Mutate ``case``'s good file into ``work`` (fresh, empty) and read it: (outcome, detail),
    with ``changed`` when an input (the good files, the mutated file) changed and ``leftover``
    when a temporary file stayed."""
    fmt, good, read = case
    before_good = _digest(good)
    path = mutate(good, work, kind, seed)
    before = snapshot(work)
    try:
        outcome, detail = read(path, work)
    finally:
        with contextlib.suppress(OSError):
            if kind == "noperm":
                Path(path).chmod(0o644)
    after = snapshot(work)
    if _digest(good) != before_good:
        return "changed", "the good input changed"
    for n, h in before.items():
        if n != "out.npz" and h is not None and after.get(n) != h:
            return "changed", f"{n} changed"
    if leftovers(work):
        return "leftover", ", ".join(leftovers(work))
    return outcome, detail


# --- the public API, argument by argument (issue 50, "What to build" 2 and 9) ---------------------
# Each target is a public callable with one good call (keyword arguments) and, per argument, the
# kind of value it takes. The fuzzer replaces one argument at a time by a hostile value: a value
# outside the argument's kind must be refused with an InputError; a value inside it must give an
# InputError or a result; any other exception, a hang or a warning is a finding.

def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_num(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _finite(x) -> bool:
    try:
        return _is_num(x) and bool(np.isfinite(float(x)))
    except OverflowError:
        return False


def _empty_1d(x) -> bool:
    try:
        a = np.asarray(x) if isinstance(x, (list, tuple, np.ndarray)) else None
    except ValueError:  # ragged
        return False
    return a is not None and a.ndim == 1 and a.size == 0 and a.dtype.kind in "iuf"


def _int_array_ok(x, lo: int, ndim: int | None = None) -> bool:
    """Could ``x`` be an exact integer array ≥ lo of rank ``ndim``? (the kind's domain)"""
    if isinstance(x, (str, bytes, dict)) or x is None or isinstance(x, (bool, np.bool_)):
        return False
    try:
        a = np.asarray(x)
    except Exception:  # noqa: BLE001
        return False
    if a.dtype == object or a.dtype.kind not in "iuf" or (ndim is not None and a.ndim != ndim) or a.size == 0:
        return False
    if a.dtype.kind == "f":
        if not np.isfinite(a).all() or not (a == np.floor(a)).all():
            return False
    return bool(a.min() >= lo)


KINDS = {
    "pos_int": lambda x: _is_int(x) and x >= 1,
    "nonneg_int": lambda x: _is_int(x) and x >= 0,
    "opt_pos_int": lambda x: x is None or (_is_int(x) and x >= 1),
    "time": lambda x: _finite(x) and float(x) > 0,
    "opt_time": lambda x: x is None or (_finite(x) and float(x) > 0),
    "opt_time_inf": lambda x: (_finite(x) and float(x) > 0) or (isinstance(x, float) and x == float("inf")),
    "nonneg_num": lambda x: _finite(x) and float(x) >= 0,
    "bool": lambda x: isinstance(x, (bool, np.bool_)),
    "pos_ints": lambda x: _int_array_ok(x, 1, 1),
    "pos_ints0": lambda x: _int_array_ok(x, 1, 1) or _empty_1d(x),
    "nonneg_ints0": lambda x: _int_array_ok(x, 0, 1) or _empty_1d(x),
    "nonneg_ints": lambda x: _int_array_ok(x, 0, 1),
    "counts": lambda x: _int_array_ok(x, 0, 3),
    "counts_LE": lambda x: _int_array_ok(x, 0, 2),
    "routes": lambda x: _int_array_ok(x, 0, 3),
    "any": lambda x: True,
}


def choice_kind(*names: str):
    return lambda x: isinstance(x, str) and x in names


def type_kind(*classes):
    return lambda x: isinstance(x, classes)


_DTYPES = ("?", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8", "c8", "<U3", "M8[s]", "O")


def hostile_values():
    """(label, value) of hostile arguments: wrong types, bools, NaN/inf, huge and negative ints,
    empty and ragged containers, numpy scalars, and a small array of every numpy dtype."""
    vals = [("None", None), ("True", True), ("False", False), ("0", 0), ("-1", -1), ("1", 1), ("2", 2),
            ("2.5", 2.5), ("2.0", 2.0), ("nan", float("nan")), ("inf", float("inf")), ("-inf", float("-inf")),
            ("2**31", 2**31), ("2**63", 2**63), ("2**64+3", 2**64 + 3), ("-2**63", -2**63), ("1e300", 1e300),
            ("'3'", "3"), ("'bogus'", "bogus"), ("''", ""), ("b'x'", b"x"), ("[]", []), ("[[]]", [[]]),
            ("ragged", [[1], [1, 2]]), ("{}", {}), ("object()", object()), ("np.int64(-1)", np.int64(-1)),
            ("np.uint64(2**63)", np.uint64(2**63)), ("np.float32(nan)", np.float32("nan")),
            ("np.bool_(True)", np.bool_(True)), ("1+1j", complex(1, 1)), ("np.float64(3.0)", np.float64(3.0))]
    for dt in _DTYPES:
        base = np.array([3, 1, 2, 4])
        if dt == "O":
            arr = np.array([3, "1", None, 4.5], dtype=object)
        elif dt == "M8[s]":
            arr = base.astype("M8[s]")
        else:
            with np.errstate(all="ignore"):
                arr = base.astype(dt)
        vals.append((f"array[{dt}]", arr))
    vals += [("array 2**40", np.array([2**40, 3], dtype=np.int64)), ("array -5", np.array([-5, 3])),
             ("array nan", np.array([np.nan, 3.0])), ("array inf", np.array([np.inf, 3.0])),
             ("array 1.5", np.array([1.5, 3.0])), ("array 2-D", np.ones((2, 2), dtype=np.int64)),
             ("array empty", np.zeros(0, dtype=np.int64)), ("array 0-D", np.array(3))]
    return vals


class Target:
    """A public callable, its good call and the kind of each argument it is fuzzed on.
    ``workdir``: the directory the call runs in (a hostile relative path such as ``'x'`` given
    to a writer lands there, never in the caller's working directory)."""

    def __init__(self, name: str, fn, good: dict, kinds: dict, check=None, cheap: bool = True,
                 workdir: Path | None = None):
        self.name, self.fn, self.good, self.kinds, self.check, self.cheap = name, fn, good, kinds, check, cheap
        self.workdir = workdir

    def call(self, **override):
        args = {**self.good, **override}
        with contextlib.chdir(self.workdir) if self.workdir is not None else contextlib.nullcontext():
            out = self.fn(**args)
        if self.check is not None:
            self.check(out, args)
        return out


def api_targets(tmp: Path) -> list[Target]:
    """Every public function and class of ``routepack_opt.__all__`` and the subpackages' public
    entry points that take arguments, with a good call on a tiny instance (a few ms each)."""
    import routepack_opt as rp
    from routepack_opt import certify, replay
    from routepack_opt.core.cost import CostModel, Stage, get_preset, load_cost, resolve_cost
    from routepack_opt.core.evaluate import Evaluator, evaluate_plan
    from routepack_opt.core.layout import Layout
    from routepack_opt.core.plan import Plan, load_plan
    from routepack_opt.core.topology import Topology
    from routepack_opt.core.window import Window, load_window, save_window
    from routepack_opt.integrations import rollout_hook
    from routepack_opt.models import binpack, branch_price, brute, colgen, equal_counts, placement
    from routepack_opt.replay.sample_counts import StreamingCounts, sample_counts, window_from_counts

    files = good_files(tmp / "api_good")
    lengths, counts, routes = _window_arrays(2)
    w = Window(lengths, counts, top_k=K)
    topo = Topology(dp=2, ep=2, capacity=1024)
    cost = resolve_cost(COST)
    plan = load_plan(files["plan"], num_samples=N)
    lay = Layout(np.asarray(plan.row), np.asarray(plan.slot), plan.rows)
    out_path = tmp / "api_out.npz"
    stage = cost.stages[0]

    def valid_window(out, args):
        assert isinstance(out, Window) and out.num_samples >= 1

    def valid_packing(out, args):
        if out is not None:
            sizes = np.asarray(args["sizes"], dtype=np.int64)
            assert out.shape == sizes.shape and (not sizes.size or np.bincount(out, weights=sizes).max() <= args["capacity"])

    def valid_mb(out, args):
        assert out.plan.validate(w) == []

    def valid_bins(out, args):
        assert out.status in ("feasible", "infeasible", "unknown")

    one_LE = counts[0]
    work = tmp / "api_cwd"
    work.mkdir(exist_ok=True)
    targets = [
        Target("routepack_opt.window_from", rp.window_from, dict(lengths=lengths, counts=counts, top_k=K),
               dict(lengths="pos_ints", counts="counts", top_k="opt_pos_int"), valid_window),
        Target("routepack_opt.Window", Window, dict(lengths=lengths, counts=counts, top_k=K, step=0),
               dict(lengths="pos_ints", counts="counts", top_k="opt_pos_int", step="any"), valid_window),
        Target("routepack_opt.Topology", Topology, dict(dp=2, ep=2, capacity=1024, min_rows=1, row_multiple=1,
                                                        equal_samples_per_slot=False, redundant_experts=0),
               dict(dp="pos_int", ep="pos_int", capacity="pos_int", min_rows="pos_int", row_multiple="pos_int",
                    equal_samples_per_slot="bool", redundant_experts="nonneg_int")),
        Target("routepack_opt.Stage", Stage, dict(name="attn", alpha=1.0, beta=0.5),
               dict(name=type_kind(str), alpha="nonneg_num", beta="nonneg_num")),
        Target("routepack_opt.CostModel", CostModel, dict(stages=(stage,), gamma=1.0),
               dict(stages="any", gamma="nonneg_num")),
        Target("routepack_opt.get_preset", get_preset, dict(name=COST), dict(name="any")),
        Target("routepack_opt.load_cost", load_cost, dict(path=files["cost"]), dict(path="any")),
        Target("routepack_opt.load_plan", load_plan, dict(path=files["plan"], num_samples=N),
               dict(path="any", num_samples="opt_pos_int")),
        Target("routepack_opt.load_window", load_window, dict(path=files["window"]), dict(path="any")),
        Target("routepack_opt.save_window", save_window, dict(window=w, path=out_path),
               dict(window=type_kind(Window), path="any")),
        Target("routepack_opt.Evaluator", Evaluator, dict(window=w, topology=topo, cost=cost),
               dict(window=type_kind(Window), topology=type_kind(Topology), cost=type_kind(CostModel))),
        Target("routepack_opt.evaluate_plan", evaluate_plan, dict(window=w, plan=plan, cost=cost, objective=None),
               dict(window=type_kind(Window), plan=type_kind(type(plan)), cost=type_kind(CostModel),
                    objective=lambda x: x is None or (isinstance(x, str) and x in ("max-sum", "sum-max")))),
        Target("routepack_opt.Layout", Layout, dict(row=lay.row, slot=lay.slot, rows=lay.rows),
               dict(row="nonneg_ints", slot="nonneg_ints", rows="pos_int")),
        Target("routepack_opt.plan_micro_batches", rp.plan_micro_batches,
               dict(lengths=lengths, counts=counts, dp_size=2, ep_size=2, max_tokens=1024, cost=COST, max_sweeps=1,
                    seed=0),
               dict(lengths="pos_ints", counts="counts", dp_size="pos_int", ep_size="pos_int", max_tokens="pos_int",
                    max_sweeps="opt_pos_int", seed="nonneg_int"), valid_mb, cheap=False),
        Target("routepack_opt.solve", rp.solve, dict(window=w, topology=topo, cost=cost, max_sweeps=1, seed=0),
               dict(window=type_kind(Window), topology=type_kind(Topology), cost=type_kind(CostModel),
                    max_sweeps="opt_pos_int", seed="nonneg_int",
                    objective=choice_kind("max-sum", "sum-max"), rows="opt_pos_int", time_limit="opt_time"),
               cheap=False),
        Target("routepack_opt.AsyncPlanner", rp.AsyncPlanner, dict(grace=1.0, warm=False),
               dict(grace=lambda x: _finite(x) and float(x) >= 0, warm="bool"),
               check=lambda out, args: out.close()),
        Target("routepack_opt.PlannerParams.from_dict", rp.PlannerParams.from_dict, dict(data={}),
               dict(data="any")),
        Target("routepack_opt.PlannerParams [anneal]",
               lambda **a: rp.PlannerParams.from_dict({"anneal": a}), dict(population=4, sweeps=10, temperatures=4),
               dict(population="pos_int", sweeps="pos_int", temperatures="pos_int")),
        Target("routepack_opt.PlannerParams [certify]",
               lambda **a: rp.PlannerParams.from_dict({"certify": a}), dict(time_limit=1.0, method="auto"),
               dict(time_limit="time", method=choice_kind(*binpack.METHODS))),
        Target("routepack_opt.Plan.from_layout", Plan.from_layout,
               dict(topology=topo, placement=np.tile(np.arange(E), (L, 1)), layout=lay, objective="max-sum"),
               dict(topology=type_kind(Topology), layout=type_kind(Layout),
                    objective=lambda x: isinstance(x, str) and x in ("max-sum", "sum-max"), placement="any")),
        Target("replay.import_replay", replay.import_replay,
               dict(source=routes, format="routes", num_experts=E, lengths=lengths),
               dict(source="routes", format=choice_kind(*replay.FORMATS), num_experts="pos_int",
                    lengths="pos_ints", top_k="opt_pos_int", moe_layer_freq="any"),
               lambda out, args: valid_window(out.window, args)),
        Target("replay.window_from_replay", replay.window_from_replay,
               dict(source=routes, format="routes", num_experts=E, lengths=lengths),
               dict(source="routes", num_experts="pos_int", lengths="pos_ints"), valid_window),
        Target("replay.moe_layers", replay.moe_layers, dict(num_layers=4, moe_layer_freq=2),
               dict(num_layers="pos_int", moe_layer_freq="any")),
        Target("replay.slime_pad_routes", replay.slime_pad_routes, dict(num_layers=2, top_k=2, num_experts=8),
               dict(num_layers="pos_int", top_k="pos_int", num_experts="pos_int")),
        Target("replay.save_window_atomic", replay.save_window_atomic, dict(window=w, path=out_path),
               dict(window=type_kind(Window), path="any")),
        Target("replay.sample_counts", sample_counts,
               dict(routes=routes[:int(lengths[0])], num_experts=E, format="routes"),
               dict(routes="routes", num_experts="pos_int", format=choice_kind(*replay.FORMATS),
                    pad_last="bool")),
        Target("replay.window_from_counts", window_from_counts, dict(counts=counts, lengths=lengths, top_k=K),
               dict(counts="counts", lengths="pos_ints", top_k="opt_pos_int"), valid_window),
        Target("replay.StreamingCounts", StreamingCounts, dict(num_samples=4, num_layers=L, num_experts=E, top_k=K),
               dict(num_samples="pos_int", num_layers="pos_int", num_experts="pos_int", top_k="pos_int")),
        Target("replay.StreamingCounts.add", lambda **a: StreamingCounts(4, L, E, K).add(**a),
               dict(index=0, counts_LE=one_LE, length=int(lengths[0])),
               dict(index=lambda x: _is_int(x) and 0 <= x < 4, counts_LE="counts_LE", length="pos_int")),
        Target("integrations.counts_from_non_tensor", rollout_hook.counts_from_non_tensor,
               dict(non_tensor_batch={rollout_hook.COUNTS_KEY: np.array(list(counts) + [None], dtype=object)[:-1]}),
               dict(non_tensor_batch="any")),
        Target("models.decide_bins", branch_price.decide_bins,
               dict(w_M=np.array([5, 3]), b_M=np.array([2, 2]), C=10, K=2, time_limit=2.0),
               dict(w_M="pos_ints", b_M="nonneg_ints", C="pos_int", K="pos_int", time_limit="time",
                    max_nodes="pos_int"), valid_bins),
        Target("models.solve_bin_packing", binpack.solve_bin_packing,
               dict(sizes=np.array([5, 4, 3, 3]), capacity=8, time_limit=2.0),
               dict(sizes="pos_ints0", capacity="pos_int", time_limit="time",
                    method=choice_kind(*binpack.METHODS), max_bins="opt_pos_int")),
        Target("models.brute_force_bins", brute.brute_force_bins, dict(sizes=[5, 4, 3], capacity=8),
               dict(sizes="pos_ints0", capacity="pos_int")),
        Target("certify.certify_rows", certify.certify_rows, dict(window=lengths, topology=topo, time_limit=2.0),
               dict(window="pos_ints", topology=type_kind(Topology), time_limit="time",
                    method=choice_kind(*binpack.METHODS), num_workers="pos_int"),
               lambda out, args: None if out.rows >= 1 else (_ for _ in ()).throw(AssertionError(out))),
        Target("models.gilmore_gomory", colgen.gilmore_gomory,
               dict(w_M=np.array([5, 3]), b_M=np.array([2, 2]), C=10, time_limit=2.0),
               dict(w_M="pos_ints", b_M="nonneg_ints", C="pos_int", time_limit="opt_time_inf",
                    max_bins=lambda x: x is None or (_is_int(x) and x >= 0), dual_cuts="bool")),
        Target("models.decide_equal_counts", equal_counts.decide_equal_counts,
               dict(lengths=np.array([5, 4, 3, 3]), dp=2, rows=1, capacity=10, time_limit=2.0),
               dict(lengths="pos_ints", dp="pos_int", rows="pos_int", capacity="pos_int", time_limit="time",
                    num_workers="pos_int")),
        Target("models.exact_placement", placement.exact_placement,
               dict(load_LE=counts.sum(axis=0), ep=2, hint_LE=np.tile(np.arange(E) % 2, (L, 1)), time_limit=2.0),
               dict(load_LE=lambda x: _int_array_ok(x, 0, 2), ep="pos_int", time_limit="time",
                    num_workers="pos_int", seed="nonneg_int")),
        Target("models.solve_layer", placement.solve_layer,
               dict(load_E=counts.sum(axis=0)[0], ep=2, hint_ranks_E=np.arange(E) % 2, time_limit=2.0),
               dict(load_E="nonneg_ints", ep="pos_int", hint_ranks_E="nonneg_ints", time_limit="time",
                    num_workers="pos_int", seed="nonneg_int")),
        *_runtime_targets(w, plan),
        Target("certify.pack_into_bins", certify.pack_into_bins,
               dict(sizes=np.array([5, 4, 3, 3]), capacity=8, num_bins=2, time_limit=2.0),
               dict(sizes="pos_ints0", capacity="pos_int", num_bins="nonneg_int", time_limit="time",
                    method=choice_kind(*binpack.METHODS), num_workers="pos_int"), valid_packing),
    ]
    for t in targets:  # every call runs in a scratch directory (relative hostile paths land there)
        t.workdir = work
    return targets


def _runtime_targets(w, plan) -> list[Target]:
    """The torch runtime's window-side entry points (none without torch)."""
    try:
        from routepack_opt.runtime import batches
    except Exception:  # noqa: BLE001 - no torch: the runtime is not installed
        return []
    from routepack_opt.core.plan import Plan
    from routepack_opt.core.window import Window

    return [
        Target("runtime.batches.sample_offsets", batches.sample_offsets, dict(lengths_N=w.lengths),
               dict(lengths_N="nonneg_ints0")),
        Target("runtime.batches.synthetic_tokens", batches.synthetic_tokens, dict(window=w, vocab=64, seed=0),
               dict(window=type_kind(Window), vocab="pos_int", seed="nonneg_int")),
        Target("runtime.batches.routes_from_counts", batches.routes_from_counts, dict(window=w, seed=0),
               dict(window=type_kind(Window), seed=lambda x: x is None or (_is_int(x) and x >= 0))),
        Target("runtime.batches.build_microbatches", batches.build_microbatches, dict(plan=plan, window=w, dp_rank=0),
               dict(plan=type_kind(Plan), window=type_kind(Window), dp_rank=lambda x: _is_int(x) and 0 <= x < 2)),
        *_runtime_model_targets(w),
    ]


def _runtime_model_targets(w) -> list[Target]:
    """The torch runtime's model, materialization, replica, dist, verify and bench entry points
    whose good call is cheap (a tiny layer or model, no process group, no timing)."""
    import torch

    from routepack_opt.runtime import bench, dist, materialize, model, moe, replicas, verify

    tensor = type_kind(torch.Tensor)
    layer = moe.MoELayer(hidden=4, ffn=4, num_experts=4, top_k=2)
    cfg = model.TinyMoEConfig(hidden=16, ffn=16, num_layers=1, num_experts=4)
    tiny = model.TinyMoE(cfg)
    x = torch.ones(3, 4)
    qkv = torch.ones(2, 5, 4)

    def enter_deterministic(**a):
        with dist.deterministic(**a):
            pass

    return [
        Target("runtime.moe.swiglu", moe.swiglu, dict(x_MH=x, w_gate_HF=torch.ones(4, 2), w_up_HF=torch.ones(4, 2),
                                                      w_down_FH=torch.ones(2, 4)),
               dict(x_MH=tensor, w_gate_HF=tensor, w_up_HF=tensor, w_down_FH=tensor)),
        Target("runtime.moe.replica_slots", moe.replica_slots,
               dict(experts_M=torch.tensor([0, 1, 1]), log2phy_EK=torch.tensor([[0], [1]]),
                    logcnt_E=torch.tensor([1, 1]), source_rank=0),
               dict(experts_M=tensor, log2phy_EK=tensor, logcnt_E=tensor, source_rank="nonneg_int")),
        Target("runtime.moe.ExpertSlots", moe.ExpertSlots, dict(num_slots=2, hidden=4, ffn=4, first_slot=0),
               dict(num_slots="nonneg_int", hidden="pos_int", ffn="pos_int", first_slot="nonneg_int")),
        Target("runtime.moe.MoELayer", moe.MoELayer,
               dict(hidden=4, ffn=4, num_experts=4, top_k=2, ep_size=1, ep_rank=0, redundant=0),
               dict(hidden="pos_int", ffn="pos_int", num_experts="pos_int", top_k=lambda v: _is_int(v) and 1 <= v <= 4,
                    ep_size="pos_int", ep_rank=lambda v: _is_int(v) and v == 0, redundant="nonneg_int")),
        Target("runtime.model.TinyMoEConfig", model.TinyMoEConfig,
               dict(vocab=64, hidden=16, heads=2, num_layers=1, num_experts=4, top_k=2, ffn=16, seed=0),
               dict(vocab="pos_int", hidden="pos_int", heads="pos_int", num_layers="pos_int", num_experts="pos_int",
                    top_k=lambda v: _is_int(v) and 1 <= v <= 4, ffn="pos_int", seed="nonneg_int")),
        Target("runtime.model.TinyMoE", model.TinyMoE, dict(cfg=cfg, ep_size=1, ep_rank=0, phy2log_LS=None),
               dict(cfg=type_kind(model.TinyMoEConfig), ep_size="pos_int", ep_rank=lambda v: _is_int(v) and v == 0,
                    phy2log_LS="any")),
        Target("runtime.model.varlen_causal_attention", model.varlen_causal_attention,
               dict(q_hTd=qkv, k_hTd=qkv, v_hTd=qkv, cu_seqlens=[0, 2, 5]),
               dict(q_hTd=tensor, k_hTd=tensor, v_hTd=tensor, cu_seqlens="any")),
        Target("runtime.model.logical_expert_tensors", model.logical_expert_tensors,
               dict(model=tiny, optimizer=None, all_replicas=False),
               dict(model=type_kind(model.TinyMoE), all_replicas="bool")),
        Target("runtime.materialize.slot_state_tensors", materialize.slot_state_tensors,
               dict(layer=layer, optimizer=None),
               dict(layer=type_kind(moe.MoELayer), optimizer=lambda v: v is None)),
        Target("runtime.materialize.materialize", materialize.materialize,
               dict(layers=tiny.moe_layers, new_placement=np.arange(4)[None]),
               dict(layers="any", new_placement="any")),
        Target("runtime.replicas.replica_exchange_plan", replicas.replica_exchange_plan, dict(layers=[layer]),
               dict(layers="any")),
        Target("runtime.replicas.exchange_plan", replicas.exchange_plan,
               dict(phy2log_LS=np.array([[0, 1, 2, 3, 0, 1]]), ep_size=2, ep_rank=0),
               dict(phy2log_LS="any", ep_size="pos_int", ep_rank=lambda v: _is_int(v) and 0 <= v < 2)),
        Target("runtime.replicas.sum_replica_grads", replicas.sum_replica_grads, dict(layers=[layer]),
               dict(layers="any", plan=lambda v: v is None)),
        Target("runtime.replicas.replica_max_diff", replicas.replica_max_diff, dict(layers=[layer], optimizer=None),
               dict(layers="any", optimizer=lambda v: v is None)),
        Target("runtime.dist.deterministic", enter_deterministic, dict(seed=0, threads=1),
               dict(seed="nonneg_int", threads=lambda v: v is None or (_is_int(v) and 0 <= v <= 1024))),
        Target("runtime.verify.VerifyConfig", verify.VerifyConfig, {},
               dict(model=type_kind(model.TinyMoEConfig), num_samples="pos_int", max_len="pos_int", dp="pos_int",
                    ep="pos_int", rows="pos_int", steps="pos_int", replace_after="pos_int", lr="time",
                    seed="nonneg_int", timeout_s="time", start_method=choice_kind("forkserver", "spawn"),
                    device=choice_kind("cpu", "cuda"), redundant="nonneg_int")),
        Target("runtime.verify.make_setup", verify.make_setup, dict(cfg=verify.VerifyConfig()),
               dict(cfg=type_kind(verify.VerifyConfig))),
        Target("runtime.bench.BenchConfig", bench.BenchConfig, {},
               dict(hidden="pos_int", heads="pos_int", ffn="pos_int", layers="pos_int", experts_per_rank="pos_int",
                    attn_lengths="any", attn_max_tokens="pos_int", expert_tokens="any", repeats="pos_int",
                    warmup="nonneg_int", measure_max_cell="pos_int", measure_max_tokens="pos_int",
                    cpu_threads="nonneg_int", seed="nonneg_int")),
        Target("runtime.bench.bench_config", bench.bench_config, dict(device="cpu", quick=True),
               dict(device="any", quick="bool")),
        Target("runtime.bench.resolve_device", bench.resolve_device, dict(name="cpu"), dict(name="any")),
        Target("runtime.bench.KernelBench", bench.KernelBench, dict(cfg=bench.bench_config("cpu", quick=True),
                                                                    device="cpu"),
               dict(cfg=type_kind(bench.BenchConfig), device="any")),
        Target("runtime.bench.nnls", bench.nnls, dict(A=np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]),
                                                      b=np.array([1.0, 2.0, 3.0])),
               dict(A="any", b="any")),
        Target("runtime.bench.fit", bench.fit, dict(X=np.array([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]]),
                                                    t=np.array([2.0, 3.0, 4.5]), names=["a", "b"]),
               dict(X="any", t="any", names="any")),
        Target("runtime.bench.scale_window", bench.scale_window, dict(window=w, scale=2.0, layers=1),
               dict(window=type_kind(type(w)), scale=lambda v: _finite(v) and float(v) >= 1, layers="pos_int")),
    ]


def run_target(target: Target, arg: str, value, timeout: float = 20.0) -> tuple[str, str]:
    """``target`` called with ``arg`` replaced by ``value``: (outcome, detail). Outcomes:
    ``clean2`` (an InputError), ``ok`` (a result that passes the target's check), ``wrong`` (a
    value outside the argument's kind accepted, or a result that fails the check), ``traceback``
    (another exception: the wrong type), ``hang``, ``memory`` (MemoryError), ``noise`` (a warning)."""
    import warnings

    kind = target.kinds[arg]
    valid = KINDS[kind](value) if isinstance(kind, str) else kind(value)
    try:
        with time_limit(timeout), warnings.catch_warnings():
            warnings.simplefilter("error")
            target.call(**{arg: value})
    except Hang:
        return "hang", ""
    except InputError as exc:
        msg = str(exc)
        return ("clean2" if msg and "\n" not in msg else "noise"), msg
    except MemoryError as exc:
        return "memory", repr(exc)[:200]
    except AssertionError as exc:
        return "wrong", f"result failed its check: {exc!r}"[:300]
    except Warning as exc:
        return "noise", f"{exc.__class__.__name__}: {exc}"[:300]
    except BaseException as exc:  # noqa: BLE001 - any other escape is the finding
        return "traceback", f"{exc.__class__.__name__}: {exc}"[:300]
    return ("ok" if valid else "wrong"), ("" if valid else "accepted a value outside the argument's kind")


# (target, argument) whose large in-range sizes wait on the stages' size guards (issue 50
# "What to build" 1, h4): a capacity of 2³¹ there allocates capacity-long tables today.
PENDING_SIZES = {("models.decide_bins", "C"), ("models.solve_bin_packing", "capacity"),
                 ("routepack_opt.plan_micro_batches", "max_tokens"), ("routepack_opt.solve", "topology"),
                 # the runtime's tensor sizes: a layer of 2³¹ slots allocates them (the guard refuses
                 # only what overflows int64)
                 *(("runtime.moe.ExpertSlots", a) for a in ("num_slots", "hidden", "ffn")),
                 *(("runtime.moe.MoELayer", a) for a in ("hidden", "ffn", "num_experts", "redundant")),
}


def pending(target: str, arg: str, value) -> bool:
    """A value that the fuzzer leaves to the sized stages: an in-range size ≥ 2²² of PENDING_SIZES."""
    return (target, arg) in PENDING_SIZES and _is_int(value) and 2**22 <= value <= 2**62


def shown_value(value) -> str:
    """The value for an assertion message (one line, at most 80 characters)."""
    from routepack_opt.core.checks import shown

    return shown(value, 80).replace("\n", " ")


def one_error(outcome, code, err, match) -> None:
    """A command ended with one clean ``error:`` line (exit 2) that says ``match``."""
    assert outcome == "clean2" and code == 2, (outcome, code, err)
    assert match in err, err


def tiny_bin_decisions(rng, trials: int, c_hi: int, b_hi: int):
    """``trials`` tiny bin-packing instances (item types ``w`` of counts ``b``, capacity ``C`` <
    ``c_hi``, counts < ``b_hi``) with their brute-force optimum, each asked for K from one below
    the optimum to two above it: ``(w, b, C, K, opt)`` (the cases where K leaves a bin of slack,
    so the empty pattern is listed, included)."""
    from routepack_opt.models.brute import brute_force_bins

    for _ in range(trials):
        C = int(rng.integers(4, c_hi))
        m = int(rng.integers(1, 4))
        w = rng.choice(np.arange(1, C + 1), size=m, replace=False)
        b = rng.integers(1, b_hi, size=m)
        opt = brute_force_bins(np.repeat(w, b), C)
        for K in (max(1, opt - 1), opt, opt + 1, opt + 2):
            yield w, b, C, K, opt
