"""Choosing the best-linked set of whole GPUs from pair scores, exactly where that is cheap.

A set (the must-include GPUs plus the chosen ones) is ranked by its weakest pair, then the sum
over its pairs, then how little the chosen GPUs are linked to the candidates left free, then the
lowest indices. The weakest pair comes first because a collective over the set runs at the pace
of its slowest hop, and it keeps a set inside one NUMA node even where a switch pair elsewhere
would raise the sum; the sum then prefers the most NVLinks and switch pairs; the third term takes
GPUs from already broken islands first, so that whole islands stay free for later requests. It is
computed as the chosen GPUs' total pair score to every must-include and candidate GPU ("pull"):
at an equal pair sum that ranks sets exactly as their links to the GPUs left free would, and it
adds up GPU by GPU, so the search can bound it.

Exact search is branch and bound over combinations in lexicographic order, started from a greedy
set, while C(candidates, needed) <= EXACT_LIMIT (C(16, 8) = 12,870, so any request on a
16-GPU node). Beyond it: greedy growth from at most SEEDS + 1 starts, then bounded swap rounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from math import comb

Rank = tuple[int, int, int]  # (weakest pair, pair sum, -pull to the candidates left free)

EXACT_LIMIT = 20_000
SEEDS = 16
SWAP_ROUNDS = 8
_UNBOUNDED = 1 << 40  # the weakest pair of a set with fewer than two GPUs


def choose_gpus(
    scores: Sequence[Sequence[int]],
    must: Sequence[int],
    candidates: Sequence[int],
    needed: int,
    exact_limit: int = EXACT_LIMIT,
) -> list[int]:
    """The best `needed` of `candidates` (ascending slots) to join `must`, ranked as the module
    docstring says: exactly (branch and bound from one greedy set) while C(candidates, needed) <=
    exact_limit, otherwise the best greedy growth from a bounded set of seeds, improved by swaps."""
    search = _GpuSearch(scores, must, candidates, needed)
    count = len(candidates)
    if comb(count, needed) <= exact_limit:
        best = search.exact(search.grow(None))
    else:
        seeds = range(0, count, max(1, -(-count // SEEDS)))
        grown = [search.grow(seed) for seed in [None, *seeds]]
        best = max(grown, key=lambda chosen: (search.rank(chosen), [-i for i in chosen]))
        best = search.improve(best)
    return [candidates[i] for i in best]


class _GpuSearch:
    """Ranks sets of candidates (local numbers 0..n-1, ascending slots) joined to the fixed
    must-include GPUs, and searches them."""

    def __init__(
        self,
        scores: Sequence[Sequence[int]],
        must: Sequence[int],
        candidates: Sequence[int],
        size: int,
    ) -> None:
        self.size = size
        self.pair = [[scores[a][b] for b in candidates] for a in candidates]
        self.must_min = [min((scores[c][m] for m in must), default=_UNBOUNDED) for c in candidates]
        self.must_sum = [sum(scores[c][m] for m in must) for c in candidates]
        self.pull = [self.must_sum[i] + sum(row) - row[i] for i, row in enumerate(self.pair)]
        inner = [scores[a][b] for a, b in combinations(must, 2)]
        self.base_min = min(inner, default=_UNBOUNDED)
        self.base_sum = sum(inner)
        self.top = max(
            (max(row[:i] + row[i + 1 :], default=0) for i, row in enumerate(self.pair)), default=0
        )
        self.best: list[int] = []
        self.best_rank: Rank = (0, 0, 0)

    def rank(self, chosen: Sequence[int]) -> Rank:
        weakest, total = self.base_min, self.base_sum
        for position, i in enumerate(chosen):
            weakest = min(weakest, self.must_min[i])
            total += self.must_sum[i]
            for j in chosen[:position]:
                weakest = min(weakest, self.pair[i][j])
                total += self.pair[i][j]
        return (weakest, total, -sum(self.pull[i] for i in chosen))

    def grow(self, seed: int | None) -> list[int]:
        """Add, one at a time, the candidate that ranks the growing set best (seed first)."""
        weakest, total = self.base_min, self.base_sum
        to_min, to_sum = list(self.must_min), list(self.must_sum)
        left = set(range(len(self.pair)))
        chosen: list[int] = []
        while len(chosen) < self.size:
            pick = seed
            if pick is None or chosen:
                pick = -max(
                    (min(weakest, to_min[i]), total + to_sum[i], -self.pull[i], -i) for i in left
                )[3]
            weakest, total = min(weakest, to_min[pick]), total + to_sum[pick]
            chosen.append(pick)
            left.discard(pick)
            row = self.pair[pick]
            to_min = [min(a, b) for a, b in zip(to_min, row, strict=True)]
            to_sum = [a + b for a, b in zip(to_sum, row, strict=True)]
        return sorted(chosen)

    def exact(self, incumbent: list[int]) -> list[int]:
        """Branch and bound over combinations in lexicographic order, starting from a good
        incumbent; a subtree is cut when even its optimistic rank cannot beat the best set."""
        self.best, self.best_rank = incumbent, self.rank(incumbent)
        self._visit(0, [], self.base_min, self.base_sum, 0, self.must_min, self.must_sum)
        return self.best

    def _visit(
        self,
        start: int,
        chosen: list[int],
        weakest: int,
        total: int,
        pull: int,
        to_min: list[int],
        to_sum: list[int],
    ) -> None:
        left = self.size - len(chosen)
        if left == 0:
            rank = (weakest, total, -pull)
            if rank > self.best_rank or (rank == self.best_rank and chosen < self.best):
                self.best, self.best_rank = list(chosen), rank
            return
        count = len(self.pair)
        rest = range(start, count)
        bound_min = min(weakest, sorted((to_min[i] for i in rest), reverse=True)[left - 1])
        if left > 1:
            bound_min = min(bound_min, self.top)
        bound_sum = total + sum(sorted((to_sum[i] for i in rest), reverse=True)[:left])
        bound_sum += self.top * left * (left - 1) // 2
        bound_pull = pull + sum(sorted(self.pull[i] for i in rest)[:left])
        bound = (bound_min, bound_sum, -bound_pull)
        if bound < self.best_rank or (
            bound == self.best_rank and chosen + list(range(start, start + left)) >= self.best
        ):
            return
        for i in range(start, count - left + 1):
            row = self.pair[i]
            chosen.append(i)
            self._visit(
                i + 1,
                chosen,
                min(weakest, to_min[i]),
                total + to_sum[i],
                pull + self.pull[i],
                [min(a, b) for a, b in zip(to_min, row, strict=True)],
                [a + b for a, b in zip(to_sum, row, strict=True)],
            )
            chosen.pop()

    def improve(self, chosen: list[int]) -> list[int]:
        """Swap one chosen candidate for an outside one while that ranks better (or equal with
        a lower index), for at most SWAP_ROUNDS rounds."""
        current, rank = sorted(chosen), self.rank(chosen)
        for _ in range(SWAP_ROUNDS):
            move: tuple[Rank, bool, int, int] | None = None
            outside = [i for i in range(len(self.pair)) if i not in current]
            for x in current:
                kept = [c for c in current if c != x]
                weakest, total, pull = self.rank(kept)
                for y in outside:
                    row = self.pair[y]
                    new = (
                        min(weakest, self.must_min[y], *(row[c] for c in kept)),
                        total + self.must_sum[y] + sum(row[c] for c in kept),
                        pull - self.pull[y],
                    )
                    if (new > rank or (new == rank and y < x)) and (
                        move is None or (new, y < x) > move[:2]
                    ):
                        move = (new, y < x, x, y)
            if move is None:
                break
            rank, x, y = move[0], move[2], move[3]
            current = sorted([c for c in current if c != x] + [y])
        return current
