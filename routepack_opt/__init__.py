"""RoutePack: plan each optimizer step of MoE RL training — expert placement and packing."""

from routepack_opt.warmup import configure_cache

configure_cache()  # ROUTEPACK_CACHE_DIR → NUMBA_CACHE_DIR, before anything imports numba

from routepack_opt.api import AsyncPlanner, MicroBatchPlan, PlanOptions, plan_micro_batches
from routepack_opt.cost import CostModel, Stage, get_preset, load_cost
from routepack_opt.errors import InputError
from routepack_opt.evaluate import Evaluator, evaluate_plan
from routepack_opt.plan import Plan, load_plan
from routepack_opt.topology import Topology
from routepack_opt.window import Window, load_window, save_window

__version__ = "0.1.0"
