"""Consumable capacity (KEP-5075) as the scheduler's allocator in Kubernetes 1.37 counts it.

The source is k8s.io/dynamic-resource-allocation `structured/internal/incubating/
consumable_capacity.go`, the allocator the scheduler runs while `DRAConsumableCapacity` is on
(beta and on in 1.37). With the gate on, every device a request reaches is checked, shareable
or not:

- a request may name only capacities the device publishes, by the very name it publishes
  (`memory`, not `gpu.nvidia.com/memory`: 1.37 looks the request's key up as it is); a device
  that lacks one is skipped;
- every capacity of the device is consumed: what the request asks, adjusted by the capacity's
  `requestPolicy`; a capacity it does not ask for consumes the policy's `default`, or without
  one the whole value. Adjusting only ever rounds up, it never refuses: below `validRange.min`
  becomes the minimum, off `validRange.step` the next step from the minimum, and with
  `validValues` the first value at or above the request;
- the amount must then keep the policy: not above `validRange.max`, on the step, one of
  `validValues` (the default always passes). A request the policy cannot hold skips the device;
- what earlier claims' shares consumed, plus this claim's other shares of the device, plus this
  amount must not pass the capacity's value.

Only a device with `allowMultipleAllocations` keeps what a result consumed (its `shareID` and
`consumedCapacity`); any other device that passes the check is allocated whole.

Quantities are whole numbers here (bytes), rounded up as Quantity.Value() rounds them. The
allocator compares a rounded amount with the default as Go values; here they are compared by
value, which agrees wherever the default lies in the range, as this driver's does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any

from deviceplugin.model.quantity import parse_quantity
from deviceplugin.model.record import record
from deviceplugin.model.slices import quantity

Amounts = Mapping[str, int]


@record(frozen=True)
class Range:
    """A `requestPolicy.validRange`."""

    min: int | None = None
    max: int | None = None
    step: int | None = None


@record(frozen=True)
class Policy:
    """A capacity's `requestPolicy`: a default and either valid values or a valid range."""

    default: int | None = None
    valid_values: tuple[int, ...] = ()
    valid_range: Range | None = None


@record(frozen=True)
class Capacity:
    """One published capacity of a device: how much it has, and how requests consume it."""

    value: int
    policy: Policy | None = None

    @classmethod
    def of(cls, entry: Mapping[str, Any]) -> Capacity:
        """From a v1 `DeviceCapacity` (`{value, requestPolicy}`) as a ResourceSlice holds it."""
        policy = entry.get("requestPolicy")
        if policy is None:
            return cls(_amount(entry["value"]))
        bounds = policy.get("validRange")
        return cls(
            _amount(entry["value"]),
            Policy(
                default=_optional(policy.get("default")),
                valid_values=tuple(_amount(v) for v in policy.get("validValues") or ()),
                valid_range=None
                if bounds is None
                else Range(*(_optional(bounds.get(key)) for key in ("min", "max", "step"))),
            ),
        )


@record(frozen=True)
class Fit:
    """What a request would consume of each capacity of one device (`consumedCapacity`), or
    `problem`: why the device cannot take it, in the policy's terms."""

    consumed: Amounts = field(default_factory=dict)
    problem: str = ""


def fit(requests: Amounts, capacities: Mapping[str, Capacity], used: Amounts) -> Fit:
    """Whether a request for `requests` fits a device with `capacities` of which `used` is
    taken already (earlier claims' shares and this claim's); the check runs over the
    capacities in name order, stopping at the first that fails, as the allocator stops at one."""
    missing = sorted(set(requests) - set(capacities))
    if missing:
        published = ", ".join(sorted(capacities)) or "none"
        return Fit(problem=f"no capacity {', '.join(missing)} (it publishes: {published})")
    consumed = {}
    for name in sorted(capacities):
        capacity = capacities[name]
        asked = requests.get(name)
        amount = consumed_amount(asked, capacity)
        broken = violation(amount, capacity)
        if broken:
            return Fit(problem=f"{name} {_wanted(asked, amount)} {broken}")
        left = capacity.value - used.get(name, 0)
        if amount > left:
            free = f"{quantity(max(left, 0))} of {quantity(capacity.value)} left"
            return Fit(problem=f"{name} {_wanted(asked, amount)} wanted, {free}")
        consumed[name] = amount
    return Fit(consumed)


def consumed_amount(asked: int | None, capacity: Capacity) -> int:
    """What a request consumes of `capacity`: `asked` rounded up by the policy, or with no
    request the policy's default (the whole value without one); Kubernetes'
    calculateConsumedCapacity."""
    policy = capacity.policy
    if asked is None:
        return capacity.value if policy is None or policy.default is None else policy.default
    if policy is None:
        return asked
    bounds = policy.valid_range
    if bounds is not None and bounds.min is not None:
        if asked < bounds.min:
            return bounds.min
        if bounds.step is None:
            return asked
        steps = -(-(asked - bounds.min) // bounds.step)
        return bounds.min + steps * bounds.step
    if policy.valid_values:
        return next((value for value in policy.valid_values if asked <= value), asked)
    return asked


def violation(amount: int, capacity: Capacity) -> str:
    """Why consuming `amount` breaks the capacity's policy ("" when it keeps it); Kubernetes'
    violatesPolicy."""
    policy = capacity.policy
    if policy is None or amount == policy.default:
        return ""
    bounds = policy.valid_range
    if bounds is not None:
        if bounds.max is not None and amount > bounds.max:
            return f"is above the requestPolicy's validRange.max {quantity(bounds.max)}"
        start = bounds.min or 0
        if bounds.step is not None and (amount - start) % bounds.step:
            return (
                f"is off the requestPolicy's validRange.step {quantity(bounds.step)}"
                f" from {quantity(start)}"
            )
        return ""
    if policy.valid_values and amount not in policy.valid_values:
        listed = ", ".join(quantity(value) for value in policy.valid_values)
        return f"is none of the requestPolicy's validValues ({listed})"
    return ""


def adjustment(asked: int, capacity: Capacity) -> str:
    """Why the scheduler consumes more than `asked` ("" when it consumes just that)."""
    amount = consumed_amount(asked, capacity)
    if amount == asked or capacity.policy is None:
        return ""
    bounds = capacity.policy.valid_range
    if bounds is None or bounds.min is None:
        reason = "is none of the requestPolicy's validValues"
    elif asked < bounds.min:
        reason = f"is below the requestPolicy's validRange.min {quantity(bounds.min)}"
    else:
        step = quantity(bounds.step or 0)
        reason = f"is off the requestPolicy's validRange.step {step} from {quantity(bounds.min)}"
    return f"{quantity(asked)} {reason}: the scheduler rounds it up to {quantity(amount)}"


def _wanted(asked: int | None, amount: int) -> str:
    if asked is None:
        return f"{quantity(amount)} (nothing asked: the default)"
    if asked == amount:
        return quantity(amount)
    return f"{quantity(asked)} (rounded up to {quantity(amount)})"


def _amount(value: object) -> int:
    return parse_quantity(str(value))


def _optional(value: object) -> int | None:
    return None if value is None else _amount(value)
