"""Torch runtime (docs/pipeline.md, step 5): expert slots with logical→physical dispatch, in-place
materialization of a new placement (weights, gradients, optimizer state; across ranks with
collectives), packed micro-batches from a plan, calibration of the cost model and measurement of
plans with real kernels.

Submodules import torch; ``import routepack_opt`` alone does not.
"""

__all__ = ["batches", "moe", "model", "materialize", "replicas", "dist", "verify", "bench"]
