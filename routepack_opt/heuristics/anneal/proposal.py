"""A move of the annealer as two small fixed records — what it proposes (:class:`Proposal`) and
what it would cost (:class:`Evaluation`, from :func:`move_delta`) — so that every move kind is
applied and undone by the same code (:func:`~routepack_opt.heuristics.anneal.state.apply_move`,
the undo log of :mod:`~routepack_opt.heuristics.anneal.moves`).

Legend: N samples, D DP slots, G shards, cell c = r·D + d, block x = r·G + g (see
:mod:`~routepack_opt.heuristics.anneal.state`).

Every move kind is one of these shapes (docs/annealer.md, "Adding a move"):

- RELOCATE: sample i from cell a to cell bc (j = N, the zero row of b: evaluated as a swap with it);
- SWAP: i from a to bc and j from bc to a;
- ROTATE: i from a to bc, j from bc to cc, k from cc to a, where cc is another cell of a's block
  (so the expert loads change exactly as for the swap i ↔ j, and block A's attention over two
  of its cells).

A move rewrites at most two blocks: A = (ra, ga), the block of a (and of cc), and B = (rb, gb).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from routepack_opt.heuristics.anneal.kernels import attn, attn_one, block_cost, delta, msum_swap

__all__ = ["Proposal", "Evaluation", "NONE", "RELOCATE", "SWAP", "ROTATE", "no_move", "n_moved",
           "attn_two_cells", "move_delta"]

# Move kinds (Proposal.kind).
NONE = -1  # no feasible proposal (rejected before any cost work)
RELOCATE = 0
SWAP = 1
ROTATE = 2

# One proposed move (every field an int64: the compiled helpers return one record type).
Proposal = namedtuple("Proposal", (
    "kind",            # NONE, RELOCATE, SWAP or ROTATE
    "i", "j", "k",     # the moved samples: i a→bc; j bc→a (SWAP), bc→cc (ROTATE), else N; k cc→a, else −1
    "a", "ra", "ga", "da",   # i's cell, its row, shard and slot
    "bc", "rb", "gb", "db",  # i's target cell, its row, shard and slot
    "cc", "dc",        # ROTATE: the third cell (in a's block, row ra) and its slot; else −1
    "Ta", "Qa",        # Σ length, Σ length² of cell a after the move
    "Tb", "Qb",        # ... of cell bc
    "Tc", "Qc",        # ... of cell cc (ROTATE)
))

# Its cost: the change of the score and the new costs and expert sums of the two blocks.
Evaluation = namedtuple("Evaluation", (
    "dms", "dtot", "dpk",  # float: Δmakespan, Δtotal, Δpeak
    "JA", "JB",            # float: new J of blocks A and B (JB = 0 when A = B)
    "MA", "MB",            # int: new Σ_l max_p W of A and B
))


@njit(cache=True, _nrt=False, inline='always')
def no_move():
    """The proposal that is not one (kind NONE)."""
    z = np.int64(0)
    m = np.int64(-1)
    return Proposal(kind=np.int64(NONE), i=m, j=m, k=m, a=m, ra=m, ga=m, da=m, bc=m, rb=m, gb=m,
                    db=m, cc=m, dc=m, Ta=z, Qa=z, Tb=z, Qb=z, Tc=z, Qc=z)


@njit(cache=True, _nrt=False, inline='always')
def n_moved(p):
    """How many samples ``p`` moves (entries it takes in the undo log)."""
    return 1 if p.kind == RELOCATE else (2 if p.kind == SWAP else 3)


@njit(cache=True, _nrt=False)
def attn_two_cells(st, pb, p):
    """Block A's attention with cells a and cc overridden (a rotation). A call, not inlined:
    the default move loop never runs it and stays as small as without it."""
    return attn(st, pb, p.ra, p.ga, p.a, p.Ta, p.Qa, p.cc, p.Tc, p.Qc)


@njit(cache=True, _nrt=False, inline='always')
def move_delta(st, pb, sc, p):
    """The :class:`Evaluation` of proposal ``p`` on replica state ``st``.

    Within one block the attention is recomputed over its cells (O(S·P)); across two blocks it
    comes from the top-two table in O(S) (a rotation's block A, two of whose cells change, from
    its cells) and the expert sums from :func:`~routepack_opt.heuristics.anneal.kernels.msum_swap`
    of i ↔ j (the zero row j = N for a relocation)."""
    A = p.ra * pb.G + p.ga
    B = p.rb * pb.G + p.gb
    if A == B:  # never a rotation (see move_rotate)
        attA = attn(st, pb, p.ra, p.ga, p.a, p.Ta, p.Qa, p.bc, p.Tb, p.Qb)
        JA = block_cost(attA, st.Msum[A], pb)
        JB = 0.0
        MA = st.Msum[A]
        MB = st.Msum[A]
        dms, dtot, dpk = delta(st, pb, p.ra, p.ga, JA, -1, -1, 0.0)
    else:
        if p.cc >= 0:
            attA = attn_two_cells(st, pb, p)
        else:
            attA = attn_one(st.At, A, p.a, p.Ta, p.Qa, pb.alpha, pb.beta)
        attB = attn_one(st.At, B, p.bc, p.Tb, p.Qb, pb.alpha, pb.beta)
        MA, MB = msum_swap(st.W, A, B, pb.b, p.i, p.j, pb.L, pb.Pp // 8, sc.m)
        JA = block_cost(attA, MA, pb)
        JB = block_cost(attB, MB, pb)
        dms, dtot, dpk = delta(st, pb, p.ra, p.ga, JA, p.rb, p.gb, JB)
    return Evaluation(dms=dms, dtot=dtot, dpk=dpk, JA=JA, JB=JB, MA=MA, MB=MB)
