"""Which devices the scheduler would allocate to a claim, decided as its allocator decides.

`allocate` takes a claim read by `dra.resourceapi`, the DeviceClasses, and the node's devices
in slice order, and searches as Kubernetes' structured allocator does: requests in order; for a
`firstAvailable` request its subrequests in order, the first that can be satisfied wins; each
request takes `count` devices (or, with `allocationMode: All`, every device its class and
selectors accept, at least one, all of which must be usable) in slice order, backtracking when
a later request or a constraint cannot be met. A device is usable for a request when

- its class's selectors and then the request's accept it (a selector that fails on a device
  fails the claim, as in Kubernetes; selectors run only on devices the search reaches);
- no other request of the claim holds it, and, unless the request asks for `adminAccess`, no
  earlier claim holds it without admin access (`allocate_all` allocates claims one after the
  other, as claims already allocated leave their devices in use). A device with
  `allowMultipleAllocations` is never held: any number of requests and claims share it;
- its capacities take the request's `capacity.requests` (`explain.capacity`: rounded up by
  the `requestPolicy`, within what earlier claims' and this claim's shares left); on a device
  with `allowMultipleAllocations` the result is a share that keeps what it consumed;
- every `NoSchedule` or `NoExecute` taint on it is tolerated by the request (`None` taints are
  ignored), as the scheduler checks with the DRADeviceTaints gate on;
- it keeps every constraint over its request: `matchAttribute` (all devices of the named
  requests share one value; a device without the attribute cannot be one of them) and
  `distinctAttribute` (no two share a value);
- the counters it consumes are left (`explain.counters`: partitionable devices, after what
  earlier claims' devices and this claim's picks consume). A pool whose counters the allocator
  refuses gives no device at all.

A claim gets at most 32 devices (AllocationResultsMaxSize). Where the allocator would search
without bound, this search gives up after a fixed number of device checks and says so.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import field
from typing import Any

from deviceplugin.explain.capacity import Amounts, Capacity, Fit, adjustment, fit
from deviceplugin.explain.counters import SharedCounters, Usage, add, consumption
from deviceplugin.explain.resourceapi import Claim, Constraint, DeviceChoice, DeviceClass, Request
from deviceplugin.explain.selectors import (
    Selector,
    SelectorError,
    SelectorLimitError,
    cel_device,
    qualified,
)
from deviceplugin.model.record import record

JsonObject = dict[str, Any]
MAX_RESULTS = 32  # AllocationResultsMaxSize: devices per claim
MAX_CHECKS = 1_000_000  # device checks before the search gives up
_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
_LISTED = 3  # devices named when saying why they lack capacity or counters


@record(frozen=True)
class Candidate:
    """One published device: its name, what CEL selectors see, its attributes (for
    constraints), its taints, its capacities, whether it allows multiple allocations and the
    shared counters it consumes."""

    name: str
    driver: str
    cel: JsonObject
    attributes: Mapping[str, JsonObject]
    taints: tuple[Mapping[str, Any], ...] = ()
    capacity: Mapping[str, Capacity] = field(default_factory=dict)
    shared: bool = False  # allowMultipleAllocations
    consumes: Usage = field(default_factory=dict)  # consumesCounters: set -> counter -> amount

    @classmethod
    def of(cls, driver: str, device: JsonObject) -> Candidate:
        """From a v1 ResourceSlice device of `driver`."""
        return cls(
            name=device["name"],
            driver=driver,
            cel=cel_device(driver, device),
            attributes=device.get("attributes") or {},
            taints=tuple(device.get("taints") or ()),
            capacity={k: Capacity.of(v) for k, v in (device.get("capacity") or {}).items()},
            shared=device.get("allowMultipleAllocations") is True,
            consumes=consumption(device),
        )

    def attribute(self, name: str) -> tuple[str, object] | None:
        """(type, value) of a fully qualified attribute, looked up as the allocator does: the
        full name, or the bare name when the domain is the driver's; None when missing."""
        value = self.attributes.get(name)
        domain, identifier = qualified(self.driver, name)
        if value is None and domain == self.driver:
            value = self.attributes.get(identifier)
        if not value:
            return None
        kind, content = next(iter(value.items()))
        return str(kind), content


@record(frozen=True)
class Allocation:
    """The devices per request (`<request>/<subrequest>` for a `firstAvailable` one), the value
    each `matchAttribute` settled on, per request the shares among its devices (device ->
    `consumedCapacity`) and what the scheduler adjusted; or `failure`, why not."""

    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    values: Mapping[str, object] = field(default_factory=dict)
    admin: tuple[str, ...] = ()  # requests allocated with admin access
    shares: Mapping[str, Mapping[str, Amounts]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    failure: str = ""


def select(selectors: Sequence[Selector], device: JsonObject) -> bool:
    """Every selector accepts the device (a `cel_device`); SelectorError when one fails."""
    return all(selector.matches(device) for selector in selectors)


def allocate_all(
    claims: Sequence[Claim],
    classes: Mapping[str, DeviceClass],
    devices: Sequence[Candidate],
    counters: SharedCounters | None = None,
) -> list[Allocation]:
    """Each claim in turn; devices an earlier claim got (without admin access) are in use, its
    shares (without admin access) take their capacity from the shared devices, and each of
    its devices consumes its counters once."""
    in_use: set[str] = set()
    used: dict[str, dict[str, int]] = {}
    counted: set[str] = set()  # devices whose counters earlier claims consume
    consumed: dict[str, dict[str, int]] = {}
    by_name = {d.name: d for d in devices}
    allocations = []
    for claim in claims:
        try:
            allocation = allocate(claim, classes, devices, in_use, used, counters, consumed)
        except SelectorLimitError as err:
            raise SelectorLimitError(f"{claim.kind} {claim.name}: {err.path}", str(err)) from err
        allocations.append(allocation)
        for request, names in allocation.devices.items():
            if request in allocation.admin:
                continue
            shares = allocation.shares.get(request, {})
            in_use.update(name for name in names if name not in shares)
            for name, amounts in shares.items():
                _add_amounts(used.setdefault(name, {}), amounts, 1)
            for name in set(names) - counted:
                counted.add(name)
                add(consumed, by_name[name].consumes, 1)
    return allocations


def allocate(
    claim: Claim,
    classes: Mapping[str, DeviceClass],
    devices: Sequence[Candidate],
    in_use: Collection[str] = (),
    used: Mapping[str, Amounts] | None = None,
    counters: SharedCounters | None = None,
    consumed: Usage | None = None,
) -> Allocation:
    """The claim's allocation on `devices` (in slice order) of one pool with `counters`,
    `in_use` held by other claims, `used` (device -> capacity -> amount) consumed by their
    shares and `consumed` (counter set -> counter -> amount) by their devices."""
    for request in claim.requests:
        for choice in request.choices:
            if choice.device_class not in classes:
                return Allocation(failure=f"{choice.name}: no DeviceClass {choice.device_class}")
    pool = counters or SharedCounters({})
    if pool.invalid and claim.requests:
        return Allocation(
            failure=f"the scheduler refuses the node's resource pool: {pool.invalid} (it"
            " allocates none of its devices)"
        )
    search = _Search(claim, classes, devices, frozenset(in_use), used or {}, pool, consumed or {})
    try:
        found = search.request(0)
    except SelectorLimitError:
        raise
    except (SelectorError, _GiveUp) as err:
        return Allocation(failure=str(err))
    if not found:
        try:
            return Allocation(failure=search.why_not())
        except SelectorLimitError:
            raise
        except SelectorError as err:
            return Allocation(failure=str(err))
    return Allocation(
        devices={name: tuple(picked) for name, picked in search.picked.items()},
        values=search.settled(),
        admin=tuple(c.name for c in search.chosen if c.admin_access),
        shares={name: dict(shares) for name, shares in search.shares.items() if shares},
        notes=search.adjusted(),
    )


class _GiveUp(Exception):
    """The search ran out of device checks."""


class _Search:
    """Depth-first over requests, choices and devices, with the state of one attempt."""

    def __init__(
        self,
        claim: Claim,
        classes: Mapping[str, DeviceClass],
        devices: Sequence[Candidate],
        in_use: frozenset[str],
        used: Mapping[str, Amounts],
        counters: SharedCounters,
        consumed: Usage,
    ) -> None:
        self.claim = claim
        self.classes = classes
        self.devices = devices
        self.in_use = in_use
        self.used = used  # by earlier claims' shares
        self.counters = counters
        self.taken: dict[str, dict[str, int]] = {}  # counters, by earlier claims and this one
        add(self.taken, consumed, 1)
        self.reserved: set[tuple[str, str]] = set()  # (choice, device) that took counters
        # where counters stopped the search with the most devices picked: how many, the
        # devices picked, and per choice each device refused and why
        self.deepest = -1
        self.deepest_picks: tuple[str, ...] = ()
        self.blocked: dict[str, dict[str, str]] = {}
        self.checks = 0
        self.selectable: dict[tuple[str, str], bool] = {}
        self.held: set[str] = set()  # devices this claim holds whole so far
        self.results = 0  # devices and shares this claim holds so far
        self.allocating: dict[str, dict[str, int]] = {}  # consumed by this claim's shares
        self.picked: dict[str, list[str]] = {}
        self.shares: dict[str, dict[str, Amounts]] = {}  # per choice: device -> consumed
        self.chosen: list[DeviceChoice] = []
        # per constraint: the (type, value) of each device added, in order
        self.values: list[list[tuple[str, object]]] = [[] for _ in claim.constraints]

    def request(self, index: int) -> bool:
        """Satisfy requests[index:] on top of what is held now."""
        if index == len(self.claim.requests):
            return True
        request = self.claim.requests[index]
        for choice in request.choices:
            self.chosen.append(choice)
            self.picked[choice.name] = []
            self.shares[choice.name] = {}
            if choice.count is None:
                done = self._take_all(index, request, choice)
            else:
                done = self._take(index, request, choice, choice.count, 0)
            if done:
                return True
            del self.picked[choice.name]
            del self.shares[choice.name]
            self.chosen.pop()
        return False

    def _take(
        self, index: int, request: Request, choice: DeviceChoice, need: int, start: int
    ) -> bool:
        if need == 0:
            return self.request(index + 1)
        if self.results + need > MAX_RESULTS:
            return False
        eligible = [
            position
            for position in range(start, len(self.devices))
            if self._eligible(request, choice, self.devices[position])
        ]
        if len(eligible) < need:
            return False
        for position in eligible:
            device = self.devices[position]
            if not self._eligible(request, choice, device):  # an earlier pick may settle a value
                continue
            self._add(request, choice, device)
            if self._take(index, request, choice, need - 1, position + 1):
                return True
            self._remove(request, choice, device)
        return False

    def _take_all(self, index: int, request: Request, choice: DeviceChoice) -> bool:
        # "All" means every device selected whose capacity could take the request before this
        # claim took any (the allocator lists them before it allocates).
        every = [
            d
            for d in self.devices
            if self._selectable(choice, d) and not self._fit(choice, d, mine=False).problem
        ]
        if not every or self.results + len(every) > MAX_RESULTS:
            return False
        added = []
        for device in every:
            if not self._eligible(request, choice, device):
                break
            self._add(request, choice, device)
            added.append(device)
        else:
            if self.request(index + 1):
                return True
        for device in reversed(added):
            self._remove(request, choice, device)
        return False

    def _eligible(self, request: Request, choice: DeviceChoice, device: Candidate) -> bool:
        self.checks += 1
        if self.checks > MAX_CHECKS:
            raise _GiveUp(f"gave up after {MAX_CHECKS:,} device checks (no allocation found yet)")
        if device.name in self.held:
            return False
        if not choice.admin_access and device.name in self.in_use:
            return False
        if not self._selectable(choice, device) or self._fit(choice, device).problem:
            return False
        if not _tolerated(choice, device):
            return False
        for constraint, values in self._applying(request, choice):
            value = device.attribute(constraint.attribute)
            if value is None:
                return False
            if constraint.distinct and value in values:
                return False
            if not constraint.distinct and values and values[0] != value:
                return False
        short = self._short(device)
        if short:
            self._blocked(choice, device, short)
            return False
        return True

    def _short(self, device: Candidate) -> str:
        """Which counter the device would take over (after earlier claims' devices and this
        claim's picks); "" when it fits or checks none."""
        if not device.consumes:
            return ""
        if device.shared and self._has_share(device):
            return ""  # its first share reserved its counters
        return self.counters.shortage(self.taken, device.consumes)

    def _blocked(self, choice: DeviceChoice, device: Candidate, short: str) -> None:
        """Remember `short` when the devices picked now are the most counters stopped yet (the
        first such picks only: one situation, explained whole)."""
        if self.results < self.deepest:
            return
        picks = tuple(n for c in self.chosen for n in self.picked[c.name])
        if self.results > self.deepest:
            self.deepest, self.deepest_picks, self.blocked = self.results, picks, {}
        if picks == self.deepest_picks:
            self.blocked.setdefault(choice.name, {})[device.name] = short

    def _fit(self, choice: DeviceChoice, device: Candidate, mine: bool = True) -> Fit:
        """The request's capacity on the device, after earlier claims' shares and (`mine`)
        this claim's."""
        used = dict(self.used.get(device.name, {}))
        if mine:
            _add_amounts(used, self.allocating.get(device.name, {}), 1)
        return fit(choice.capacity, device.capacity, used)

    def _selectable(self, choice: DeviceChoice, device: Candidate) -> bool:
        """The class's selectors, then the request's (remembered per choice and device)."""
        key = (choice.name, device.name)
        if key not in self.selectable:
            selectors = (*self.classes[choice.device_class].selectors, *choice.selectors)
            try:
                self.selectable[key] = select(selectors, device.cel)
            except SelectorLimitError:
                raise
            except SelectorError as err:
                raise SelectorError(f"{choice.name}: device {device.name}: {err}") from err
        return self.selectable[key]

    def _applying(
        self, request: Request, choice: DeviceChoice
    ) -> list[tuple[Constraint, list[tuple[str, object]]]]:
        return [
            (constraint, values)
            for constraint, values in zip(self.claim.constraints, self.values, strict=True)
            if _applies(constraint, request, choice)
        ]

    def _add(self, request: Request, choice: DeviceChoice, device: Candidate) -> None:
        if device.consumes and not (device.shared and self._has_share(device)):
            add(self.taken, device.consumes, 1)
            self.reserved.add((choice.name, device.name))
        if device.shared:
            consumed = self._fit(choice, device).consumed
            self.shares[choice.name][device.name] = consumed
            _add_amounts(self.allocating.setdefault(device.name, {}), consumed, 1)
        else:
            self.held.add(device.name)
        self.results += 1
        self.picked[choice.name].append(device.name)
        for constraint, values in self._applying(request, choice):
            value = device.attribute(constraint.attribute)
            assert value is not None
            values.append(value)

    def _has_share(self, device: Candidate) -> bool:
        """An earlier claim or this one has a share of the device."""
        return device.name in self.used or any(device.name in s for s in self.shares.values())

    def _remove(self, request: Request, choice: DeviceChoice, device: Candidate) -> None:
        if (choice.name, device.name) in self.reserved:
            self.reserved.discard((choice.name, device.name))
            add(self.taken, device.consumes, -1)
        consumed = self.shares[choice.name].pop(device.name, None)
        if consumed is not None:
            _add_amounts(self.allocating[device.name], consumed, -1)
        self.held.discard(device.name)
        self.results -= 1
        self.picked[choice.name].remove(device.name)
        for _, values in self._applying(request, choice):
            values.pop()

    def settled(self) -> dict[str, object]:
        return {
            constraint.attribute: values[0][1]
            for constraint, values in zip(self.claim.constraints, self.values, strict=True)
            if not constraint.distinct and values
        }

    def adjusted(self) -> tuple[str, ...]:
        """What the scheduler made of the chosen requests' capacity: requests rounded up on a
        share, and devices that took a capacity request whole."""
        notes = []
        for choice in self.chosen:
            if not choice.capacity:
                continue
            for name in self.picked[choice.name]:
                device = next(d for d in self.devices if d.name == name)
                if name not in self.shares[choice.name]:
                    notes.append(
                        f"{choice.name}: {name} does not allow multiple allocations, so the"
                        " capacity request only picks it: the claim gets all of it"
                    )
                    continue
                for capacity, asked in sorted(choice.capacity.items()):
                    why = adjustment(asked, device.capacity[capacity])
                    if why:
                        notes.append(f"{choice.name}: {name}: capacity {capacity}: {why}")
        return tuple(notes)

    def why_not(self) -> str:
        """Per request: how many devices match, which of those it could not use, how many it
        wants; and whether only the constraints or the other requests stand in the way."""
        parts = []
        alone = True
        for request in self.claim.requests:
            possible = False
            for choice in request.choices:
                part, fits = self._alone(choice)
                parts.append(part)
                possible = possible or fits
            alone = alone and possible
        counts = "; ".join(parts)
        if alone and self.claim.constraints:
            names = ", ".join(
                f"{'distinctAttribute' if c.distinct else 'matchAttribute'} {c.attribute}"
                for c in self.claim.constraints
            )
            together = f"no devices satisfy the requests together under {names}"
            return f"{together} ({counts}){self._counted()}"
        if alone:
            return f"the requests cannot all be met at once ({counts}){self._counted()}"
        return f"not enough devices ({counts})"

    def _counted(self) -> str:
        """Where counters stopped the search with the most devices picked: "; with A, B
        picked, c: ... D: counter set S ran out of ...", or "" when counters never did."""
        if not self.blocked:
            return ""
        choice, refused = next(iter(self.blocked.items()))
        picked = ", ".join(self.deepest_picks) or "nothing"
        return f"; with {picked} picked, {choice}: {_listed(refused, 'counters left')}"

    def _alone(self, choice: DeviceChoice) -> tuple[str, bool]:
        """What one choice sees, and whether it could be met if it were the only one."""
        matching = [d for d in self.devices if self._selectable(choice, d)]
        short = {
            d.name: problem
            for d in matching
            if (problem := self._fit(choice, d, mine=False).problem)
        }
        if choice.count is None:  # "All" leaves out what lacks capacity; the rest must be usable
            matching = [d for d in matching if d.name not in short]
        tainted = [d for d in matching if not _tolerated(choice, d)]
        busy = [] if choice.admin_access else [d for d in matching if d.name in self.in_use]
        unusable = {d.name for d in (*tainted, *busy)} | set(short)
        # counters are checked on what is left (the allocator checks in use first)
        spent = {
            d.name: problem
            for d in matching
            if d.name not in unusable and (problem := self._short(d))
        }
        usable = len({d.name for d in matching} - unusable - set(spent))
        wanted = "all" if choice.count is None else str(choice.count)
        part = f"{choice.name}: {wanted} wanted, {len(matching)} match"
        too_many = (choice.count or len(matching)) > MAX_RESULTS
        left_out = [
            f"{len(tainted)} tainted without a toleration" if tainted else "",
            f"{len(busy)} held by an earlier claim" if busy else "",
            _listed(short, "capacity"),
            _listed(spent, "counters left"),
            f"a claim gets at most {MAX_RESULTS} devices" if too_many else "",
        ]
        if any(left_out):
            part += f" ({', '.join(text for text in left_out if text)})"
        if choice.count is None:
            fits = 0 < usable == len(matching) <= MAX_RESULTS
        else:
            fits = choice.count <= min(usable, MAX_RESULTS)
        return part, fits


def _listed(short: Mapping[str, str], lacking: str) -> str:
    """The devices without the capacity or counters, the first few with the reason."""
    if not short:
        return ""
    named = "; ".join(f"{name}: {problem}" for name, problem in list(short.items())[:_LISTED])
    more = f"; and {len(short) - _LISTED} more" if len(short) > _LISTED else ""
    return f"{len(short)} without the {lacking}: {named}{more}"


def _add_amounts(into: dict[str, int], amounts: Amounts, sign: int) -> None:
    for name, amount in amounts.items():
        into[name] = into.get(name, 0) + sign * amount


def _applies(constraint: Constraint, request: Request, choice: DeviceChoice) -> bool:
    """A constraint names no requests (all of them), the request, or this subrequest."""
    if not constraint.requests:
        return True
    return request.name in constraint.requests or choice.name in constraint.requests


def _tolerated(choice: DeviceChoice, device: Candidate) -> bool:
    """Every taint that would keep the request off the device is tolerated."""
    return all(
        any(toleration.tolerates(taint) for toleration in choice.tolerations)
        for taint in device.taints
        if taint.get("effect") in _BLOCKING_EFFECTS
    )
