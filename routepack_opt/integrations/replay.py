"""Routing-replay import, re-exported from :mod:`routepack_opt.replay` (format readers sit below
the seams and the replay report; see that package for the formats), so that
``from routepack_opt.integrations.replay import import_replay`` keeps working."""

from routepack_opt.replay import (
    FORMATS,
    MAX_EXPERTS,
    ReplayImport,
    import_replay,
    moe_layers,
    save_window_atomic,
    slime_pad_routes,
    warm_import,
    window_from_replay,
)

__all__ = ["ReplayImport", "import_replay", "warm_import", "window_from_replay", "FORMATS", "moe_layers",
           "slime_pad_routes", "save_window_atomic", "MAX_EXPERTS"]
