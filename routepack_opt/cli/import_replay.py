"""``routepack import-replay``: routes recorded by slime / verl / a plain file → a window ``.npz``."""

from __future__ import annotations

from routepack_opt.cli.common import add_json, emit, nonneg_int, positive_int
from routepack_opt.core.errors import InputError


def register(sub) -> None:
    p = sub.add_parser("import-replay", help="routing replay recorded by a trainer → window (.npz)",
                       description="Build a window (lengths, counts[N, L, E]) from the per-token routes a "
                       "trainer recorded, in one compiled pass over the valid tokens. Formats: slime "
                       "(per-sample [T_i - 1, "
                       "layers, top_k] routes, a list in a .pt, np.savez positional arrays, an object "
                       ".npy, a dict with rollout_routed_experts/total_lengths, or one padded [N, T, "
                       "layers, top_k] tensor), verl (routed_experts [B, S, layers, top_k] with "
                       "attention_mask), routes ([tokens, layers, top_k] with a lengths vector, or "
                       "per-sample [T_i, layers, top_k]). Files: .pt, .npy, .npz, .safetensors; see "
                       "docs/formats.md.")
    p.add_argument("routes", metavar="ROUTES", help="routes file (.pt, .npy, .npz, .safetensors)")
    p.add_argument("--format", choices=["slime", "verl", "routes"], default="routes")
    p.add_argument("--num-experts", type=int, required=True, help="logical experts E per MoE layer")
    p.add_argument("--lengths", metavar="LEN.npy", help="1-D tokens per sample (.npy): plain routes "
                   "need it when the file has none; slime: total_lengths (routes + 1 per sample)")
    p.add_argument("--moe-layer-freq", help="Megatron's moe_layer_freq: an int, or a comma list of 0/1 "
                   "(dense layers are dropped, in every format; slime: detected when not given)")
    p.add_argument("--top-k", type=positive_int, help="expected router top-k (checked)")
    p.add_argument("--step", type=nonneg_int, help="optimizer step stored in the window")
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
        shown = value if len(value) <= 40 else value[:39] + "…"
        raise InputError(f"--moe-layer-freq: expected an int or a comma list of 0/1, got {shown!r}") from None


def run(args) -> None:
    from routepack_opt.core.io import check_output_path
    from routepack_opt.replay import import_replay, save_window_atomic

    if not args.output:
        raise InputError("-o: the output name is empty; give a file name such as w.npz")
    check_output_path(args.output, args.routes, args.lengths)  # before the import, not after it
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
    text += "".join(f"\nnote: {n}" for n in imp.notes)
    emit(args, rep, text)
