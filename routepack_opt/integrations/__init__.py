"""Seams into the trainers our users run (slime, verl, Megatron-Core) and routing-replay import.

One module per framework; each imports the framework (torch, verl, megatron-core) only inside the
functions that need it, so ``import routepack_opt.integrations`` stays cheap and works without any
of them installed. These modules import the rest of the package, never the other way round.

- :mod:`.replay`   — re-exports :mod:`routepack_opt.replay` (routes as the frameworks record them →
  a :class:`~routepack_opt.core.window.Window`; the readers sit below the seams)
- :mod:`.slime`    — drop-in for ``slime.utils.dp_schedule.build_dp_schedule``
- :mod:`.verl`     — drop-in for ``verl.utils.seqlen_balancing.rearrange_micro_batches`` (the driver's
  global-batch plan in :mod:`.verl_balance`, the ``RayPPOTrainer`` hook in :mod:`.verl_trainer`)
- :mod:`.megatron` — logical→physical expert placement for Megatron-Core ``MoELayer``
- :mod:`.ray`      — ``RayPlanner`` (the planner in a Ray actor) and ``replay-report``'s parallel runs

Every seam call yields a :class:`SeamRecord` (ours vs the framework's own function on the same
input); where the framework asserts, a seam raises :class:`FrameworkAssertionError`. Settings:
:mod:`._seam` (keyword > ``ROUTEPACK_*`` > default).
"""

from routepack_opt.integrations._seam import FrameworkAssertionError, SeamRecord
from routepack_opt.replay import ReplayImport, import_replay, window_from_replay

__all__ = ["ReplayImport", "import_replay", "window_from_replay", "SeamRecord", "FrameworkAssertionError"]
