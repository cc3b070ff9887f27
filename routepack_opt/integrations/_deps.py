"""The trainer-side libraries, imported on first use and only here.

torch, safetensors and verl are needed only when a trainer calls in (or a replay file in their
format is read); importing an integration module (verl loads ``verl_plugin`` during its own
import) must not pay for them, nor fail where one is missing.
"""

from __future__ import annotations

import functools

from routepack_opt.core.deps import require
from routepack_opt.replay._deps import torch  # one cached handle for the readers and the seams

__all__ = ["torch", "torch_distributed", "safe_open", "verl_tensordict_utils",
           "verl_log_seqlen_unbalance", "verl_seqlen_balancing"]


@functools.cache
def torch_distributed():
    torch()
    import torch.distributed as module

    return module


@functools.cache
def safe_open():
    """``safetensors.safe_open``."""
    return require("safetensors", "reading safetensors replay files").safe_open


@functools.cache
def verl_tensordict_utils():
    from verl.utils import tensordict_utils as module

    return module


@functools.cache
def verl_log_seqlen_unbalance():
    from verl.utils.seqlen_balancing import log_seqlen_unbalance as fn

    return fn


@functools.cache
def verl_seqlen_balancing():
    from verl.utils import seqlen_balancing as module

    return module
