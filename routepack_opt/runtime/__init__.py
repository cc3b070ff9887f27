"""Torch runtime (docs/pipeline.md, step 5): expert slots with logical→physical dispatch, in-place
materialization of a new placement (weights, gradients, optimizer state; across ranks with
collectives), packed micro-batches from a plan, calibration of the cost model and measurement of
plans with real kernels.

Submodules import torch; ``import routepack_opt`` alone does not. torch is an extra
(``routepack-opt[torch]``, or the training environment's own): without it, importing this package
raises :class:`routepack_opt.core.deps.MissingDependency`, one ``error:`` line in the CLI.
"""

from routepack_opt.core.deps import require

require("torch", "the torch runtime (calibrate, measure, verify-runtime, plan materialization)")

__all__ = ["batches", "moe", "model", "materialize", "replicas", "dist", "verify", "bench"]
