"""Shared counters (partitionable devices, KEP-4815) as Kubernetes 1.37's structured allocator
keeps them, so `dra explain` packs MIG partitions as the scheduler does.

The counter sets of a pool are those of its slices that carry `sharedCounters`, looked up by
name: a device names the set it consumes from, not a slice. The allocator refuses a whole pool
(allocates none of its devices) when two slices declare a set of one name, or a device consumes
from a set, or a counter of a set, that the pool does not publish. A device that consumes
counters fits when, with what the devices already allocated consume (earlier claims, each
device once however many shares it has) and what the devices picked so far in this search
consume, none of its counters goes over its value (the allocator looks at every counter of
the pool, but only the device's can have gone over); picking it reserves its consumption,
backtracking gives it back (1.37 returns it on every path: kubernetes#140431). A device that
allows multiple allocations and already has a share is not checked again: its first share
reserved for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from deviceplugin.model.quantity import parse_quantity
from deviceplugin.model.record import record
from deviceplugin.model.slices import quantity

JsonObject = dict[str, Any]
Usage = Mapping[str, Mapping[str, int]]  # counter set -> counter -> amount


@record(frozen=True)
class SharedCounters:
    """A pool's counter sets (set -> counter -> value) and, when the allocator would refuse
    the pool, why."""

    sets: Usage
    invalid: str = ""

    @classmethod
    def of(cls, slices: Iterable[JsonObject]) -> SharedCounters:
        """From the v1 ResourceSlices of one pool, checked as the allocator checks them."""
        sets: dict[str, dict[str, int]] = {}
        devices: list[JsonObject] = []
        for item in slices:
            spec = item["spec"]
            devices.extend(spec.get("devices") or ())
            for counter_set in spec.get("sharedCounters") or ():
                name = counter_set["name"]
                if name in sets:
                    return cls(sets, f"duplicate counter set name {name}")
                sets[name] = {k: _amount(v) for k, v in counter_set["counters"].items()}
        for device in devices:
            for set_name, counters in consumption(device).items():
                if set_name not in sets:
                    return cls(sets, f"device {device['name']}: counter set {set_name} not found")
                for counter in counters:
                    if counter not in sets[set_name]:
                        return cls(
                            sets,
                            f"device {device['name']}: counter {counter} not found in counter"
                            f" set {set_name}",
                        )
        return cls(sets)

    def shortage(self, used: Usage, wanted: Usage) -> str:
        """Why `wanted` does not fit on top of `used` ("" when it does): each counter it would
        take over its value."""
        problems = []
        for set_name, counters in wanted.items():
            values = self.sets.get(set_name, {})
            over = []
            for counter, amount in counters.items():
                value = values.get(counter, 0)
                left = value - used.get(set_name, {}).get(counter, 0)
                if amount > left:
                    over.append(
                        f"{counter} ({quantity(amount)} wanted, {quantity(max(left, 0))} of"
                        f" {quantity(value)} left)"
                    )
            if over:
                problems.append(f"counter set {set_name} ran out of {', '.join(over)}")
        return "; ".join(problems)


def consumption(device: JsonObject) -> dict[str, dict[str, int]]:
    """What a v1 device consumes, summed per counter set and counter."""
    found: dict[str, dict[str, int]] = {}
    for entry in device.get("consumesCounters") or ():
        counters = found.setdefault(entry["counterSet"], {})
        for name, counter in entry["counters"].items():
            counters[name] = counters.get(name, 0) + _amount(counter)
    return found


def add(into: dict[str, dict[str, int]], amounts: Usage, sign: int) -> None:
    """Add (sign 1) or take back (sign -1) `amounts`."""
    for set_name, counters in amounts.items():
        target = into.setdefault(set_name, {})
        for name, amount in counters.items():
            target[name] = target.get(name, 0) + sign * amount


def _amount(counter: object) -> int:
    value = counter.get("value") if isinstance(counter, Mapping) else None
    return parse_quantity(str(value))
