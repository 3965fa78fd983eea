"""Placement of MIG devices and time-sliced replicas: which groups of interchangeable IDs to draw
from, so that a preferred allocation keeps whole GPUs free (MIG) or spreads load (replicas).

Works on plain integers so it stays independent of how the caller indexes devices: a *group* is
a parent GPU (MIG) or a physical device (replicas), numbered so that a lower number means a lower
index; a *slot* is a device position, lower meaning earlier in the resource's order. `free` maps a
group to its healthy, available, not yet chosen slots in ascending order; `used` maps a group to
how many of its devices are taken already (not in the kubelet's available list).
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Mapping, Sequence


def pack_mig(
    free: Mapping[int, Sequence[int]],
    used: Mapping[int, int],
    must_groups: Collection[int],
    needed: int,
) -> list[int]:
    """Choose `needed` MIG slots on as few parent GPUs as possible.

    Parents that already hold a must-include device cost no extra parent, so they are drawn from
    first. Then, while no single parent can hold the rest, the parent with the most free slots is
    emptied (the fewest parents in all); the last parent is the most used one that fits, so GPUs
    nobody uses stay whole. Ties go to fewer free slots (the tighter fit), then the lower index.
    """
    picks: list[int] = []
    groups = sorted(group for group, slots in free.items() if slots)
    first = sorted((g for g in groups if g in must_groups), key=lambda g: (-used.get(g, 0), g))
    for group in first:
        picks.extend(free[group][: max(needed - len(picks), 0)])
    rest = [g for g in groups if g not in must_groups]
    while len(picks) < needed and rest:
        want = needed - len(picks)
        fitting = [g for g in rest if len(free[g]) >= want]
        if fitting:
            group = min(fitting, key=lambda g: (-used.get(g, 0), len(free[g]), g))
        else:
            group = min(rest, key=lambda g: (-len(free[g]), -used.get(g, 0), g))
        picks.extend(free[group][:want])
        rest.remove(group)
    return picks


def spread_replicas(
    free: Mapping[int, Sequence[int]],
    used: Mapping[int, int],
    picked: Mapping[int, int],
    needed: int,
    packed: bool,
) -> list[int]:
    """Choose `needed` replica slots one at a time, as the reference plugin's greedy path does.

    Each round takes the group with the fewest (`packed`: the most) devices in use, counting
    the ones chosen in this call; ties go to the group least chosen from in this call (so a
    request for two does not take two replicas of one GPU while another GPU is equally loaded),
    then to the lower index. `picked` holds groups already chosen from, e.g. by must-include IDs.
    A heap keeps each round O(log groups), which matters with thousands of replicas.
    """
    sign = -1 if packed else 1
    heap: list[tuple[int, int, int]] = []
    for group, slots in free.items():
        if slots:
            load = used.get(group, 0) + picked.get(group, 0)
            heapq.heappush(heap, (sign * load, picked.get(group, 0), group))
    taken: dict[int, int] = {}
    picks: list[int] = []
    while len(picks) < needed and heap:
        load, count, group = heapq.heappop(heap)
        offset = taken.get(group, 0)
        picks.append(free[group][offset])
        taken[group] = offset + 1
        if offset + 1 < len(free[group]):
            heapq.heappush(heap, (load + sign, count + 1, group))
    return picks
