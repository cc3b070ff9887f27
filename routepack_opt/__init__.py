"""RoutePack: plan each optimizer step of MoE RL training — expert placement and packing.

``routepack_opt.solve(window, topology, cost, *, objective=..., placement=..., params=...)`` is the
one entry point (:mod:`routepack_opt.pipeline`); ``plan_micro_batches`` and ``AsyncPlanner`` wrap
it for trainers. ``import routepack_opt`` stays cheap (no numba, torch or OR-Tools): the names
that need the compiled kernels are imported on first use (PEP 562 ``__getattr__`` below).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from routepack_opt.core.cache import configure_cache

configure_cache()  # ROUTEPACK_CACHE_DIR → NUMBA_CACHE_DIR, before anything imports numba

from routepack_opt.core.cost import CostModel, Stage, get_preset, load_cost  # noqa: E402
from routepack_opt.core.errors import InputError  # noqa: E402
from routepack_opt.core.evaluate import Evaluator, evaluate_plan  # noqa: E402
from routepack_opt.core.layout import Layout  # noqa: E402
from routepack_opt.core.plan import Plan, load_plan  # noqa: E402
from routepack_opt.core.report import PlanReport, SearchStats  # noqa: E402
from routepack_opt.core.topology import Topology  # noqa: E402
from routepack_opt.core.window import Window, load_window, save_window  # noqa: E402

if TYPE_CHECKING:
    from routepack_opt.api import AsyncPlanner, MicroBatchPlan, PlanOptions, plan_micro_batches, window_from
    from routepack_opt.params import PlannerParams
    from routepack_opt.pipeline import solve

__all__ = ["AsyncPlanner", "MicroBatchPlan", "PlanOptions", "plan_micro_batches", "CostModel", "Stage",
           "get_preset", "load_cost", "InputError", "Evaluator", "evaluate_plan", "Plan", "load_plan",
           "Topology", "Window", "load_window", "save_window"]

__version__ = "0.1.0"

# name → module of the names imported on first use (they import numba and OR-Tools)
_LAZY = {"solve": "routepack_opt.pipeline", "PlannerParams": "routepack_opt.params",
         "plan_micro_batches": "routepack_opt.api", "AsyncPlanner": "routepack_opt.api",
         "MicroBatchPlan": "routepack_opt.api", "PlanOptions": "routepack_opt.api",
         "window_from": "routepack_opt.api"}

__all__ = ["solve", "PlannerParams", "plan_micro_batches", "AsyncPlanner", "MicroBatchPlan",
           "PlanOptions", "window_from", "Plan", "PlanReport", "SearchStats", "Layout", "load_plan",
           "Window", "load_window", "save_window", "Topology", "CostModel", "Stage", "get_preset",
           "load_cost", "Evaluator", "evaluate_plan", "InputError"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'routepack_opt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
