"""Strict reading of a decoded JSON document into frozen dataclasses, every problem located.

The reference plugin decodes its config file as JSON into Go structs, so a value is taken only
as the type its field declares: `"2"` is not a number, `"true"` is not a boolean, `2.0` is not
an integer. A `Reader` checks one value and returns it (or `BAD`), appending a `Problem` for
each thing wrong with it; readers compose (`tuple_of`, `nullable`, `model`, `checked`,
`before`), and `model` reads a dataclass whose fields name their key and reader (`field`).
Every field of a mapping is read, so all of its problems are reported at once, in field order;
a model's own check (`model_check`) runs only once each of its fields was read cleanly.

Plain functions and dataclasses, no schema to build: reading the config costs nothing at import
and little at start-up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from deviceplugin.model.config_keys import describe
from deviceplugin.model.record import record

Loc = tuple[str | int, ...]
BAD: Any = object()  # what a reader returns for a value it found problems with
_T = TypeVar("_T")


class Invalid(ValueError):
    """Raised by a check: what is wrong, at `subpath` below the value checked (`[0].name`)."""

    def __init__(self, message: str, subpath: str = "") -> None:
        super().__init__(message)
        self.subpath = subpath


@record(frozen=True)
class Problem:
    """One thing wrong with the document: where (keys and list positions), and what."""

    loc: Loc
    message: str
    subpath: str = ""


Problems = list[Problem]
Reader = Callable[[Any, Loc, Problems], Any]
Check = Callable[[Any], Any]


def _wrong_type(what: str) -> Callable[[Any, Loc, Problems], Any]:
    def report(value: Any, loc: Loc, problems: Problems) -> Any:
        quoted = " (a quoted string)" if isinstance(value, str) else ""
        problems.append(Problem(loc, f"must be {what}, got {describe(value)}{quoted}"))
        return BAD

    return report


def _of_type(accept: Callable[[Any], bool], what: str) -> Reader:
    wrong = _wrong_type(what)

    def read(value: Any, loc: Loc, problems: Problems) -> Any:
        return value if accept(value) else wrong(value, loc, problems)

    return read


string = _of_type(lambda value: isinstance(value, str), "a string")
boolean = _of_type(lambda value: isinstance(value, bool), "true or false")
integer = _of_type(
    lambda value: isinstance(value, int) and not isinstance(value, bool), "an integer"
)


def as_is(value: Any, loc: Loc, problems: Problems) -> Any:
    """Any value, as it is: for a field whose `before` step has judged it already."""
    return value


def literal(*choices: str) -> Reader:
    """One of the strings `choices`."""
    shown = [repr(choice) for choice in choices]
    expected = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"

    def read(value: Any, loc: Loc, problems: Problems) -> Any:
        if isinstance(value, str) and value in choices:
            return value
        problems.append(Problem(loc, f"must be {expected}, got {describe(value)}"))
        return BAD

    return read


def nullable(reader: Reader) -> Reader:
    """`reader`'s value, or None for null."""
    return lambda value, loc, problems: None if value is None else reader(value, loc, problems)


def tuple_of(reader: Reader) -> Reader:
    """A list, read item by item into a tuple; every item's problems are reported."""
    wrong = _wrong_type("a list")

    def read(value: Any, loc: Loc, problems: Problems) -> Any:
        if not isinstance(value, list | tuple):
            return wrong(value, loc, problems)
        items = tuple(reader(item, (*loc, i), problems) for i, item in enumerate(value))
        return BAD if any(item is BAD for item in items) else items

    return read


def _apply(check: Check, value: Any, loc: Loc, problems: Problems) -> Any:
    try:
        return check(value)
    except ValueError as exc:  # Invalid, or a ValueError saying what is wrong
        problems.append(Problem(loc, str(exc), getattr(exc, "subpath", "")))
        return BAD


def checked(reader: Reader, *checks: Check) -> Reader:
    """`reader`, then each check on what it read (a check returns the value, or raises)."""

    def read(value: Any, loc: Loc, problems: Problems) -> Any:
        value = reader(value, loc, problems)
        for check in checks:
            if value is BAD:
                break
            value = _apply(check, value, loc, problems)
        return value

    return read


def before(prepare: Check, reader: Reader) -> Reader:
    """`prepare` the raw value (it may raise), then `reader` on what it gave."""

    def read(value: Any, loc: Loc, problems: Problems) -> Any:
        value = _apply(prepare, value, loc, problems)
        return BAD if value is BAD else reader(value, loc, problems)

    return read


def field(
    key: str | None = None,
    read: Reader | None = None,
    default: Any = dataclasses.MISSING,
    check_default: bool = False,
) -> Any:
    """A dataclass field read from `key` (the field's own name when None) with `read`; without
    a default it is required. `check_default`: the default is read too, so its checks apply."""
    metadata = {"key": key, "read": read, "check_default": check_default}
    return dataclasses.field(default=default, metadata=metadata)


def model(cls: type[_T]) -> Reader:
    """A mapping read into the dataclass `cls`, field by field (see `field`)."""
    wrong = _wrong_type("a mapping")

    def read(value: Any, loc: Loc, problems: Problems) -> Any:
        if not isinstance(value, Mapping):
            return wrong(value, loc, problems)
        return read_model(cls, value, loc, problems)

    return read


def key_of(spec: dataclasses.Field[Any]) -> str:
    """The document key of a dataclass field."""
    return spec.metadata.get("key") or spec.name


def read_model(cls: type[_T], value: Mapping[str, Any], loc: Loc, problems: Problems) -> Any:
    """`value` read into `cls`; BAD (with `problems` appended) if anything in it is wrong."""
    seen = len(problems)
    values: dict[str, Any] = {}
    for spec in dataclasses.fields(cls):  # type: ignore[arg-type]
        key, reader = key_of(spec), spec.metadata["read"]
        if key in value:
            values[spec.name] = reader(value[key], (*loc, key), problems)
        elif spec.default is not dataclasses.MISSING:
            given = spec.default
            if spec.metadata["check_default"]:
                given = reader(given, (*loc, key), problems)
            values[spec.name] = given
        else:
            problems.append(Problem((*loc, key), "is required"))
    if len(problems) > seen:
        return BAD
    made = cls(**values)
    check = getattr(made, "model_check", None)
    return made if check is None else _apply(lambda _: check(), made, loc, problems)


def dump(value: Any) -> Any:
    """A dataclass tree as the document it reads from (keys as written, lists for tuples)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {key_of(spec): dump(getattr(value, spec.name)) for spec in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [dump(item) for item in value]
    return value
