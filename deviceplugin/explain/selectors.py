"""CEL device selectors evaluated as the scheduler evaluates them, with a real CEL library.

The environment follows Kubernetes' DRA selector environment as far as DeviceClasses use it:

- one variable, `device`: `device.driver`, `device.attributes[<domain>].<id>` (string, int,
  bool; a version attribute is a semantic version), `device.capacity[<domain>].<id>` (a
  quantity). An attribute without a domain belongs to the driver's. A domain the device does not
  have is an empty map, so `has(device.attributes['x.com'].y)` is false, while reading a missing
  attribute is an evaluation error, which in Kubernetes fails the allocation;
- Kubernetes' quantity library (`quantity('10Gi')`, `isQuantity`, `compareTo`, `isGreaterThan`,
  `isLessThan`, `add`, `sub`, `asInteger`) and semver library (`semver('1.2.3')`, `isSemver`,
  `compareTo`, `isGreaterThan`, `isLessThan`, `major`, `minor`, `patch`), the strings extension
  and `cel.bind`.

The CEL library cannot carry custom object types through Python functions, so quantities travel
as integers (bytes, rounded up as Quantity.Value() does) and semantic versions as their strings;
the functions above are declared on those types. One consequence: those functions also accept
plain ints and strings where Kubernetes would refuse them at compile time.
"""

from __future__ import annotations

import re
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_strings

from deviceplugin.model.errors import DevicePluginError
from deviceplugin.model.quantity import parse_quantity

JsonObject = dict[str, Any]

_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?"
)
_LITERAL = re.compile(r"'([^'\\]*)'|\"([^\"\\]*)\"")


class SelectorError(DevicePluginError):
    """A selector does not compile, or fails on a device (Kubernetes then fails the claim)."""


class SelectorLimitError(SelectorError):
    """The CEL library gave up evaluating a selector (its iteration budget, or an internal
    error): bad input, not a claim that fails. `path` names the expression's field."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path


def parse_semver(text: str) -> tuple[int, int, int, tuple[str, ...]]:
    """Semantic version 2.0.0 as a sortable key; a pre-release sorts before its release."""
    match = _SEMVER.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a semantic version")
    major, minor, patch, pre = match.groups()
    return int(major), int(minor), int(patch), (tuple(pre.split(".")) if pre else ("\uffff",))


def _is(parse: Any) -> Any:
    def check(text: str) -> bool:
        try:
            parse(text)
        except ValueError:
            return False
        return True

    return check


def _compare(a: Any, b: Any) -> int:
    return int(a > b) - int(a < b)


def _environment() -> Any:
    integer, string, boolean = cel.Type.INT, cel.Type.STRING, cel.Type.BOOL

    def member(name: str, result: Any, on: Any, impl: Any, tag: str, *extra: Any) -> Any:
        return cel.Overload(f"{tag}_{name}", result, [on, *extra], is_member=True, impl=impl)

    def semver_of(text: str) -> str:
        parse_semver(text)
        return text

    def versions(op: Any) -> Any:
        return lambda a, b: op(parse_semver(a), parse_semver(b))

    functions = [
        cel.FunctionDecl(
            "quantity", [cel.Overload("quantity_string", integer, [string], impl=parse_quantity)]
        ),
        cel.FunctionDecl(
            "isQuantity",
            [cel.Overload("is_quantity_string", boolean, [string], impl=_is(parse_quantity))],
        ),
        cel.FunctionDecl(
            "semver", [cel.Overload("semver_string", string, [string], impl=semver_of)]
        ),
        cel.FunctionDecl(
            "isSemver",
            [cel.Overload("is_semver_string", boolean, [string], impl=_is(parse_semver))],
        ),
        cel.FunctionDecl(
            "compareTo",
            [
                member("compareTo", integer, integer, _compare, "quantity", integer),
                member("compareTo", integer, string, versions(_compare), "semver", string),
            ],
        ),
        cel.FunctionDecl(
            "isGreaterThan",
            [
                member("isGreaterThan", boolean, integer, lambda a, b: a > b, "quantity", integer),
                member(
                    "isGreaterThan", boolean, string, versions(lambda a, b: a > b), "semver", string
                ),
            ],
        ),
        cel.FunctionDecl(
            "isLessThan",
            [
                member("isLessThan", boolean, integer, lambda a, b: a < b, "quantity", integer),
                member(
                    "isLessThan", boolean, string, versions(lambda a, b: a < b), "semver", string
                ),
            ],
        ),
        cel.FunctionDecl(
            "add", [member("add", integer, integer, lambda a, b: a + b, "quantity", integer)]
        ),
        cel.FunctionDecl(
            "sub", [member("sub", integer, integer, lambda a, b: a - b, "quantity", integer)]
        ),
        cel.FunctionDecl(
            "asInteger", [member("asInteger", integer, integer, lambda a: a, "quantity")]
        ),
    ]
    for position, part in enumerate(("major", "minor", "patch")):
        impl = (lambda n: lambda text: parse_semver(text)[n])(position)
        functions.append(cel.FunctionDecl(part, [member(part, integer, string, impl, "semver")]))
    return cel.NewEnv(
        variables={"device": cel.Type.DYN},
        extensions=[ext_bindings.ExtBindings(), ext_strings.ExtStrings()],
        functions=functions,
    )


_ENV = _environment()


class Selector:
    """One compiled CEL selector; raises SelectorError when it does not compile."""

    def __init__(self, expression: str, path: str = "") -> None:
        self.expression = expression
        self.path = path  # the field it came from, for SelectorLimitError
        try:
            self._program = _ENV.compile(expression)
        except RuntimeError as err:
            raise SelectorError(f"selector does not compile: {err}") from err
        # Domains the expression may index; absent ones must read as empty maps.
        self._literals = {a or b for a, b in _LITERAL.findall(expression)}

    def matches(self, device: JsonObject) -> bool:
        """Whether `device` (from `cel_device`) is selected; SelectorError if evaluation fails
        (SelectorLimitError when the library gives up)."""
        value = {
            "driver": device["driver"],
            "attributes": self._with_empty(device["attributes"]),
            "capacity": self._with_empty(device["capacity"]),
        }
        try:
            result = self._program.eval(data={"device": value})
        except RuntimeError as err:  # not a CEL error value: the library stopped
            raise SelectorLimitError(self.path, f"CEL evaluation failed: {err}") from None
        kind = result.type()
        if kind == cel.Type.ERROR:
            raise SelectorError(f"{self.expression}: {result.value()}")
        if kind != cel.Type.BOOL:
            raise SelectorError(f"{self.expression}: returned {kind.name()}, not a bool")
        return bool(result.value())

    def _with_empty(self, domains: dict[str, Any]) -> dict[str, Any]:
        missing = self._literals.difference(domains)
        return {**domains, **{key: {} for key in missing}} if missing else domains


def cel_device(driver: str, device: JsonObject) -> JsonObject:
    """A v1 ResourceSlice device as the selector's `device` variable sees it."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in (device.get("attributes") or {}).items():
        domain, identifier = qualified(driver, name)
        attributes.setdefault(domain, {})[identifier] = next(iter(value.values()))
    capacity: dict[str, dict[str, Any]] = {}
    for name, value in (device.get("capacity") or {}).items():
        domain, identifier = qualified(driver, name)
        capacity.setdefault(domain, {})[identifier] = parse_quantity(str(value["value"]))
    return {"driver": driver, "attributes": attributes, "capacity": capacity}


def qualified(driver: str, name: str) -> tuple[str, str]:
    """(domain, identifier) of an attribute or capacity name; no domain means the driver's."""
    domain, _, identifier = name.rpartition("/")
    return domain or driver, identifier
