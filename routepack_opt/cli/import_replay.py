"""``routepack import-replay``: routes recorded by slime / verl / a plain file → a window ``.npz``."""

from __future__ import annotations

from routepack_opt.cli.common import add_json, emit
from routepack_opt.core.errors import InputError


def register(sub) -> None:
    p = sub.add_parser("import-replay", help="routing replay recorded by a trainer → window (.npz)",
                       description="Build a window (lengths, counts[N, L, E]) from the per-token routes a "
                       "trainer recorded, one sample at a time. Formats: slime (list of [T_i, layers, "
                       "top_k] in a .pt), verl (.pt dict with routed_experts [B, S, layers, top_k] and "
                       "attention_mask), routes ([tokens, layers, top_k] .npy/.npz/.pt/.safetensors "
                       "with a lengths vector).")
    p.add_argument("routes", metavar="ROUTES", help="routes file (.pt, .npy, .npz, .safetensors)")
    p.add_argument("--format", choices=["slime", "verl", "routes"], default="routes")
    p.add_argument("--num-experts", type=int, required=True, help="logical experts E per MoE layer")
    p.add_argument("--lengths", metavar="LEN.npy", help="lengths vector (plain .npy routes)")
    p.add_argument("--moe-layer-freq", help="Megatron's moe_layer_freq: an int, or a comma list of 0/1 "
                   "(dense layers are dropped; slime: detected when not given)")
    p.add_argument("--top-k", type=int, help="expected router top-k (checked)")
    p.add_argument("--step", type=int, help="optimizer step stored in the window")
    p.add_argument("-o", "--output", required=True, metavar="W.npz")
    add_json(p)
    p.set_defaults(func=run)


def _freq(value: str | None):
    if value is None:
        return None
    try:
        if "," in value or value.startswith("["):
            return [int(v) for v in value.strip("[]").split(",") if v.strip()]
        return int(value)
    except ValueError:
        raise InputError(f"--moe-layer-freq: expected an int or a comma list of 0/1, got {value!r}") from None


def run(args) -> None:
    from routepack_opt.integrations.replay import import_replay, save_window_atomic

    imp = import_replay(args.routes, format=args.format, num_experts=args.num_experts,
                        lengths=args.lengths, moe_layer_freq=_freq(args.moe_layer_freq),
                        top_k=args.top_k, step=args.step)
    out = save_window_atomic(imp.window, args.output, inputs=(args.routes, args.lengths))
    rep = dict(imp.report(), path=str(out))
    text = (f"wrote {out}: N={rep['samples']} L={rep['layers']} E={rep['experts']} k={rep['top_k']} "
            f"tokens={rep['tokens']}")
    if rep["dropped_layers"]:
        text += f"; dropped dense layers {rep['dropped_layers']}"
    if rep["imputed_tokens"]:
        text += f"; imputed {rep['imputed_tokens']} unrouted (zero-filled) token rows"
    if rep["pad_tokens"]:
        text += f"; counted slime's pad route for the last token of {rep['pad_tokens']} samples"
    emit(args, rep, text)
