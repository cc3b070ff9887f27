"""RoutePack: plan each optimizer step of MoE RL training — expert placement and packing."""

from routepack_opt.core.cache import configure_cache

configure_cache()  # ROUTEPACK_CACHE_DIR → NUMBA_CACHE_DIR, before anything imports numba

from routepack_opt.api import AsyncPlanner, MicroBatchPlan, PlanOptions, plan_micro_batches
from routepack_opt.core.cost import CostModel, Stage, get_preset, load_cost
from routepack_opt.core.errors import InputError
from routepack_opt.core.evaluate import Evaluator, evaluate_plan
from routepack_opt.core.plan import Plan, load_plan
from routepack_opt.core.topology import Topology
from routepack_opt.core.window import Window, load_window, save_window

__all__ = ["AsyncPlanner", "MicroBatchPlan", "PlanOptions", "plan_micro_batches", "CostModel", "Stage",
           "get_preset", "load_cost", "InputError", "Evaluator", "evaluate_plan", "Plan", "load_plan",
           "Topology", "Window", "load_window", "save_window"]

__version__ = "0.1.0"
