"""verl end to end: a real verl TensorDict batch with routed_experts → RoutePack's
rearrange_micro_batches (vs verl's own) → restore_dynamic_batch, plus the expert map.

    python experiments/integrations/verl_example.py          # needs verl (README's first command); --ray: RayPlanner

In a verl job: ``ROUTEPACK_VERL=1`` in the workers' environment enables the ``verl.plugins``
entry point, which swaps ``verl.utils.seqlen_balancing.rearrange_micro_batches`` for ours.
"""

import sys
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict
from verl.utils.seqlen_balancing import rearrange_micro_batches as verl_rearrange
from verl.utils.seqlen_balancing import restore_dynamic_batch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from routepack_opt.integrations.verl import expert_map_from_batch, rearrange_micro_batches  # noqa: E402

rng = np.random.default_rng(0)
B, E, top_k, layers = 32, 16, 2, 2
lengths = [int(x) for x in np.clip(rng.lognormal(6.5, 0.7, B), 32, 4000)]
S = max(lengths)
mask = torch.zeros(B, S, dtype=torch.int64)
routed = torch.zeros(B, S, layers, top_k, dtype=torch.int64)     # zero-filled, as verl stores it
for b, n in enumerate(lengths):
    mask[b, :n] = 1
    r = np.argsort(rng.random((n - 1, layers, E)), axis=2)[:, :, :top_k]
    routed[b, :n - 1] = torch.from_numpy(r)                       # no route for the last token
batch = TensorDict({"input_ids": torch.randint(0, 1000, (B, S)) * mask, "attention_mask": mask,
                    "routed_experts": routed}, batch_size=[B])

cap = 8192
_, theirs = verl_rearrange(batch, cap)
micro_batches, ours = rearrange_micro_batches(batch, cap, max_sweeps=20)
tok = lambda parts: [sum(lengths[i] for i in p) for p in parts]  # noqa: E731
print(f"verl:      {len(theirs)} micro-batches, tokens {tok(theirs)}")
print(f"routepack: {len(ours)} micro-batches, tokens {tok(ours)} (cap {cap})")
logits = torch.cat([mb["input_ids"].float().mean(1, keepdim=True) for mb in micro_batches])
restored = restore_dynamic_batch(logits, ours)
assert torch.equal(restored, batch["input_ids"].float().mean(1, keepdim=True))
print("restore_dynamic_batch round trip: ok")
print("expert map (EP=4) layer 0:", expert_map_from_batch(batch, E, 4)[0].tolist())

if "--ray" in sys.argv:  # the whole step planned in a Ray actor on a CPU worker (verl's driver is a Ray driver)
    import ray

    from routepack_opt.integrations.ray import RayPlanner
    from routepack_opt.integrations.replay import import_replay

    ray.init(num_cpus=2, include_dashboard=False)  # verl's driver has already done this
    w = import_replay(routed, format="verl", attention_mask=mask, num_experts=E).window
    with RayPlanner(grace=1.0) as planner:
        planner.submit(w.lengths, w.counts, deadline=10.0, dp_size=4, ep_size=4, max_tokens=cap, max_sweeps=20)
        mb = planner.result()  # by the deadline: the plan, or a valid fallback (never raises)
    print("RayPlanner:", mb.num_micro_batches, "micro-batches per rank, rank 0:", mb.micro_batches[0])
    ray.shutdown()
