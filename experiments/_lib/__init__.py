"""What the experiment scripts share: settings (command-line flags, the results folder of a
study), statistics (block bootstrap, Kendall tau) and report writers (markdown tables, atomic
JSON/text files, matplotlib figures).

The scripts run as ``python3 experiments/<study>.py``, which puts ``experiments/`` on
``sys.path``, so they import ``from _lib import report, settings, stats``. Tests put
``experiments/`` on ``sys.path`` themselves (``tests/experiments/conftest.py``).

Nothing here imports ``routepack_opt`` except ``_lib.referee`` (the referee studies' common
setting), so the writers and statistics are testable without numba, OR-Tools or torch.
"""
