"""slime end to end: routes in slime's format → RoutePack's build_dp_schedule → per-rank schedule
and the step's expert map.

    python experiments/integrations/slime_example.py           # --ray: also plan with RayPlanner

In a slime job the same call sits in ``RolloutManager._split_train_data_by_dp`` (``slime/ray/
rollout.py``), with ``routed_experts=data.get("rollout_routed_experts")``; or, without routes,
``routepack_opt.integrations.slime.install(slime.ray.rollout, cost=...)`` swaps the function.
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from routepack_opt.integrations.slime import plan_dp_schedule  # noqa: E402

rng = np.random.default_rng(0)
E, top_k, layers = 32, 4, 3                     # layer 0 dense (moe_layer_freq = [0, 1, 1])
lengths = [int(x) for x in rng.integers(200, 3000, size=64)]
popular = np.ones(E)
popular[:4] = 10.0                               # a few hot experts, as in real routing
routed = []
for n in lengths:                                # slime records len - 1 routes per sample
    g = rng.gumbel(size=(n - 1, layers, E)) + np.log(popular)
    r = np.argsort(-g, axis=2)[:, :, :top_k]
    r[:, 0] = 0                                  # dense layer: all-zero rows
    routed.append(r)

args = SimpleNamespace(use_dynamic_batch_size=True, max_tokens_per_gpu=8192, num_experts=E,
                       expert_model_parallel_size=4, balance_data=False, micro_batch_size=1)
tp = {"dp_size": 8, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
sched = plan_dp_schedule(args, tp, lengths, global_batch_size=32, rollout_indices=[i // 2 for i in range(64)],
                         routed_experts=routed, moe_layer_freq=[0, 1, 1], max_sweeps=20)
partitions, micro_batch_indices, num_microbatches, global_batch_sizes = sched.as_slime()
print("micro-batches per rank per step:", num_microbatches, "| rollouts per step:", global_batch_sizes)
for r in range(2):
    toks = [sum(lengths[partitions[r][i]] for i in mb) for mb in micro_batch_indices[r]]
    print(f"rank {r}: samples {partitions[r][:6]}..., tokens per micro-batch {toks}")
print("step 0 logical→physical map, MoE layer 0:", sched.logical_to_physical[0][0].tolist())
print("predicted step time (µs):", round(sched.reports[0]["score"]["makespan"]),
      "| dropped trailing samples:", sched.dropped_samples)

if "--ray" in sys.argv:  # the planner in a Ray actor, off the driver's critical path (needs ray)
    import ray

    from routepack_opt.integrations.ray import RayPlanner
    from routepack_opt.integrations.replay import import_replay

    ray.init(num_cpus=2, include_dashboard=False)  # slime's driver has already done this
    w = import_replay(routed, format="slime", num_experts=E).window  # the next step's replay
    with RayPlanner(grace=1.0) as planner:
        planner.submit(w.lengths, w.counts, deadline=10.0, dp_size=8, ep_size=4, max_tokens=8192, max_sweeps=20)
        # ... the current step trains here; submit() returned at once ...
        mb = planner.result()  # by the deadline: the plan, or a valid fallback (never raises)
    print("RayPlanner:", mb.num_micro_batches, "micro-batches per rank,", mb.report.get("fallback") or "planned")
    ray.shutdown()
