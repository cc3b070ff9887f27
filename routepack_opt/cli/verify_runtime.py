"""``routepack verify-runtime``: re-placing experts mid-run changes no loss and no parameter; with
``--redundant-experts N``, training with replicated experts (and a replica-set change) equals
training without them."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time

from routepack_opt.cli.common import add_json, emit, nonneg_int, positive_float, positive_int
from routepack_opt.core.errors import InputError

MAX_STEPS = 1000
MAX_WORLD = 256


def replica_check_placement(load_LE, redundant: int, ep: int):
    """The replicated placement the replica check runs (``VerifyConfig.placer``): the planner's
    own (:func:`~routepack_opt.heuristics.placement.replicate.replicated_placement`: EPLB's
    greedy counts, LPT on distinct ranks, swaps) for E + ``redundant`` slots. Where ``ep`` ranks
    cannot hold that many copies on distinct ranks (one process: ep = 1), it is planned for the
    fewest ranks that can (a divisor of the slot count) and re-stated for ``ep`` (the same
    slots; copies of an expert then share a rank)."""
    import numpy as np

    from routepack_opt.core.placement import Placement
    from routepack_opt.heuristics.placement.replicate import replicated_placement

    load_LE = np.asarray(load_LE, dtype=np.float64)
    E = load_LE.shape[1]
    S = E + redundant
    ranks = next(d for d in [ep, *range(2, S + 1)] if S % d == 0 and S <= E * d)
    pl = replicated_placement(load_LE, ranks, S)
    return pl if ranks == ep else Placement(pl.phy2log, ep, E)


@contextlib.contextmanager
def _deadline(seconds: float):
    """A TimeoutError in the main thread after ``seconds`` (SIGALRM; nothing where signals cannot
    be set: off the main thread the distributed part's own timeout still holds)."""
    def fire(signum, frame):
        raise TimeoutError("verify-runtime: --timeout")

    try:
        old = signal.signal(signal.SIGALRM, fire)
    except ValueError:
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def register(sub) -> None:
    p = sub.add_parser("verify-runtime", help="train a tiny MoE model, re-place experts mid-run "
                       "(one process and N gloo processes with EP all-to-all), compare with a "
                       "run that never re-places")
    p.add_argument("--world-size", type=positive_int, default=4,
                   help="gloo processes = DP slots of the distributed check (1: single process only; default 4)")
    p.add_argument("--ep", type=positive_int, default=None,
                   help="EP size P (default 2, or 1 when the world size is odd)")
    p.add_argument("--steps", type=positive_int, default=3,
                   help=f"optimizer steps (re-placement after the first; at most {MAX_STEPS})")
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--timeout", type=positive_float, default=180.0,
                   help="seconds allowed for the whole command (default 180)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cpu (gloo; default) or cuda (nccl, one GPU per rank)")
    p.add_argument("--redundant-experts", type=nonneg_int, default=0, metavar="N",
                   help="the replica check: N redundant expert slots per layer (E=8 + N divisible by "
                        "--ep, N ≤ 8·(ep−1)); compares with one holder per expert (default 0: the "
                        "re-placement check)")
    p.add_argument("--start-method", choices=["forkserver", "spawn"], default="forkserver",
                   help="how ranks start (torch.multiprocessing; default forkserver: torch imported once)")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> None:
    t0 = time.monotonic()
    from routepack_opt.runtime.verify import VerifyConfig, verify_runtime

    ep = args.ep if args.ep is not None else (2 if args.world_size % 2 == 0 else 1)
    if args.steps > MAX_STEPS:  # each step trains the model once per run: hours at 10^5
        raise InputError(f"--steps {args.steps}: at most {MAX_STEPS} (the check needs 2)")
    if args.world_size > MAX_WORLD:
        raise InputError(f"--world-size {args.world_size}: at most {MAX_WORLD} processes")
    if args.steps < 2:
        raise InputError(f"--steps must be ≥ 2 (re-placement happens after step 1), got {args.steps}")
    if args.timeout <= 0:
        raise InputError("--timeout must be positive")
    if args.world_size < 1 or ep < 1 or args.world_size % ep:
        raise InputError(f"--world-size {args.world_size} is not divisible by --ep {ep}"
                         if args.world_size >= 1 and ep >= 1 else "--world-size and --ep must be ≥ 1")
    cfg = dataclasses.replace(VerifyConfig(), steps=args.steps, seed=args.seed,
                              timeout_s=args.timeout, start_method=args.start_method,
                              device=args.device, dp=args.world_size, ep=ep,
                              redundant=args.redundant_experts,
                              placer=replica_check_placement if args.redundant_experts else None)
    try:
        # --timeout covers the whole command, not just the processes
        with _deadline(max(0.01, args.timeout - (time.monotonic() - t0))):
            rep = verify_runtime(cfg, world_size=args.world_size, ep=ep)
    except TimeoutError:  # the user's budget, not our failure: say so and how to fix it
        raise InputError(f"verify-runtime did not finish within --timeout {args.timeout:g} s "
                         f"({args.world_size} processes, each starting torch and a process group); "
                         "give it more time (default 180)") from None
    if args.redundant_experts:
        emit(args, rep, _replica_text(rep))
        if not rep["ok"]:
            raise SystemExit(1)
        return
    lines = [f"verify-runtime: world_size={rep['world_size']} ep={rep['ep']} steps={rep['steps']} "
             f"(re-placed {rep['experts_replaced']} experts after step {rep['replace_after']})"]
    for mode in ("single_process", "distributed"):
        if mode in rep:
            m = rep[mode]
            extra = (f", vs single-process loss diff {m['vs_single_process_loss_diff']:.2e}"
                     if "vs_single_process_loss_diff" in m else "")
            lines.append(f"  {mode:15s} max_abs_diff {m['max_abs_diff']:.3g} "
                         f"(bitwise equal: {m['bitwise_equal']}), bytes moved {m['bytes_moved']:,}, "
                         f"{m['seconds']} s{extra}")
    lines.append(f"max_abs_diff {rep['max_abs_diff']:.3g}  bytes_moved {rep['bytes_moved']:,}  "
                 f"world_size {rep['world_size']}  ok {rep['ok']}")
    emit(args, rep, "\n".join(lines))
    if not rep["ok"]:
        raise SystemExit(1)


def _replica_text(rep: dict) -> str:
    lines = [f"verify-runtime: world_size={rep['world_size']} ep={rep['ep']} steps={rep['steps']} "
             f"redundant_experts={rep['redundant_experts']} (up to {rep['max_replicas']} replicas; "
             f"replica counts of {rep['logcnt_changes']} (layer, expert) pairs change after step "
             f"{rep['replace_after']})"]
    for mode in ("single_process", "distributed"):
        if mode in rep:
            m = rep[mode]
            lines.append(f"  {mode:15s} vs one holder: max_abs_diff weights {m['max_abs_diff_weights']:.3g}, "
                         f"adam {m['max_abs_diff_adam']:.3g} (float64 {m['max_abs_diff_float64']:.3g}); "
                         f"shuffled replicas bitwise equal: {m['moved_bitwise_equal']}; copies differ by "
                         f"{m['replica_max_diff']:.3g}; bytes moved {m['bytes_moved']:,}; {m['seconds']} s")
            if "replica_grad_bytes_per_step" in m:
                lines.append(f"  {'':15s} replica gradient exchange per step (bytes, all ranks): "
                             f"{m['replica_grad_bytes_per_step']}")
    lines.append(f"max_abs_diff {rep['max_abs_diff']:.3g} (tolerance {rep['tolerance']:g})  "
                 f"bytes_moved {rep['bytes_moved']:,}  world_size {rep['world_size']}  ok {rep['ok']}")
    return "\n".join(lines)
