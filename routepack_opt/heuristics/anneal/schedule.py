"""The annealing schedule: the temperature ladder, the moves per rung (a fixed budget, or fitted
to a time limit), and systematic resampling between rungs.

The ladder is geometric and scaled from the seeds: ``T_hot`` is the ``t_hot_quantile`` of |ΔE|
over random moves sampled from the seed layouts (moves that change the makespan only), or the
``t_hot_quantile_near`` when the best seed is within ``near_gap`` of the layout lower bound (a
hot start would only undo it: at N = 16,384 the median ladder never got back below the seed),
``T_cold = t_cold_ratio · T_hot``. Between temperatures the population is resampled
systematically (Carpenter, Clifford & Fearnhead 1999) with weights
``exp(-(1/T_{k+1} - 1/T_k)·E)``.
"""

from __future__ import annotations

import numpy as np

from routepack_opt.heuristics.anneal.config import AnnealConfig
from routepack_opt.heuristics.anneal.rng import uniform

__all__ = ["ladder", "moves_per_rung", "fit_rung", "resample_parents", "systematic"]


def ladder(deltas: np.ndarray, seed_energy: np.ndarray, cfg: AnnealConfig,
           quantile: float | None = None) -> tuple[np.ndarray, float, float]:
    """(temperatures hot → cold, T_hot, T_cold) from |ΔE| of random proposals around the seeds;
    T_hot is their ``quantile`` (default ``cfg.t_hot_quantile``)."""
    q = cfg.t_hot_quantile if quantile is None else quantile
    ref = float(np.max(np.abs(seed_energy)))
    deltas = deltas[deltas > cfg.tie_eps * ref]  # moves that change the makespan
    t_hot = float(np.quantile(deltas, q)) if deltas.size else max(ref, 1.0) * 1e-3
    t_cold = t_hot * cfg.t_cold_ratio
    nT = cfg.temperatures
    temps = t_hot * (t_cold / t_hot) ** (np.arange(nT) / max(nT - 1, 1))
    return temps, t_hot, t_cold


def moves_per_rung(total_moves: int, rungs: int) -> list[int]:
    """A budget of proposals per replica split over the rungs, the remainder to the first."""
    return [total_moves // rungs + (1 if k < total_moves % rungs else 0) for k in range(rungs)]


def fit_rung(planned: int, done: int, left: float, rate: float, rungs_left: int,
             fill_time: bool) -> int:
    """Proposals of this rung under a time limit: the remaining rungs share 90 % of the ``left``
    seconds at the measured ``rate`` (proposals per replica-second). At most ``planned`` (the
    budget's share) unless ``fill_time``; never fewer than ``done`` already."""
    fit = done + int(0.9 * max(left, 0.0) * rate / rungs_left)
    return max(done, fit if fill_time else min(planned, fit))


def systematic(weights: np.ndarray, u: float) -> np.ndarray:
    """Systematic resampling (Carpenter, Clifford & Fearnhead 1999): K parent indices."""
    K = weights.size
    cum = np.cumsum(weights / weights.sum())
    cum[-1] = 1.0
    points = (u + np.arange(K)) / K
    return np.minimum(np.searchsorted(cum, points, side="left"), K - 1)


def resample_parents(energy: np.ndarray, t_now: float, t_next: float, seed: int, rung: int
                     ) -> np.ndarray:
    """Parents of the next rung's replicas, drawn from (seed, rung)."""
    K = energy.size
    dbeta = 1.0 / t_next - 1.0 / t_now
    w = np.exp(-dbeta * (energy - energy.min()))
    return systematic(w, uniform(seed, 7, rung) / K)
