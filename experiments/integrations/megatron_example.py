"""Megatron-Core end to end (CPU): megatron-core's own top-k router and permute/unpermute, with
RoutePack's logical→physical map applied between route and dispatch, and the experts migrated.

    python experiments/integrations/megatron_example.py      # needs the [megatron] extra

In a Megatron job, per MoE layer l: ``handle = apply_expert_placement(moe_layer, physical_to_logical=p2l[l])``;
between optimizer steps: ``migrate_experts([...expert_slot_tensors(layer.experts, optimizer)...],
old_p2l, new_p2l, ep_rank=..., ep_size=..., group=ep_group)`` then ``handle.set(new_p2l[l])``.
The GPU parts (real MoELayer forward, NCCL, DistributedOptimizer): experiments/megatron_gpu_check.py.
"""

import sys
import warnings
from pathlib import Path

import numpy as np
import torch

warnings.filterwarnings("ignore")
from megatron.core.transformer.moe.moe_utils import permute, topk_routing_with_score_function, unpermute  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from routepack_opt.heuristics.placement.lpt import lpt_placement  # noqa: E402
from routepack_opt.integrations.megatron import migrate_experts, rank_token_counts, remap_routing  # noqa: E402

T, E, k, H, ep = 2048, 16, 2, 8, 4
torch.manual_seed(0)
logits = torch.randn(T, E, dtype=torch.float64)
logits[:, :4] += 2.0                                     # experts 0-3 are hot: all on rank 0 by default
probs, routing_map = topk_routing_with_score_function(logits, k, fused=False)
load = routing_map.sum(0).numpy()[None].astype(np.int64)
l2p = lpt_placement(load, ep)
p2l = np.argsort(l2p, axis=1)
print("tokens per EP rank, Megatron contiguous:", rank_token_counts(routing_map.long(), ep).tolist())
probs_p, map_p = remap_routing(probs, routing_map, p2l[0])
print("tokens per EP rank, RoutePack placement:", rank_token_counts(map_p.long(), ep).tolist())

x = torch.randn(T, H, dtype=torch.float64)
W = torch.randn(E, H, H, dtype=torch.float64)           # expert weights in slot order
def moe(probs, rmap, W):
    perm, pprobs, idx = permute(x, rmap, probs=probs, fused=False)
    y = torch.cat([c @ W[s] for s, c in enumerate(torch.split(perm, rmap.sum(0).tolist()))])
    return unpermute(y * pprobs[:, None], idx, x.shape, routing_map=rmap, fused=False)
before = moe(probs, routing_map, W)
slots = [[[W[s]] for s in range(E)]]                     # one layer, E slots, one tensor each
migrate_experts(slots, np.arange(E)[None], p2l)          # slot s now holds logical p2l[s]
after = moe(probs_p, map_p, W)
print("outputs identical with and without the placement:", torch.equal(before, after))
