"""`record`: a dataclass without compiling code as the class is defined.

`dataclasses.dataclass` writes each class its own `__init__`, `__repr__`, `__eq__`, `__hash__`
and, when frozen, `__setattr__` and `__delattr__` as source text and compiles them as the class
is created: about half a millisecond a class, over the hundred classes `serve` imports a fifth
of its start-up. `record` lets `dataclasses` keep the field table (so `fields`, `replace`,
`asdict` and type checkers see a dataclass) and gives every class the same few methods, written
once, which read that table. Instances behave as `dataclass` makes them: the same constructor
arguments and errors, equality, hash, repr, `__post_init__` and frozenness.

    @record(frozen=True)             # also: @record, kw_only=True, eq=False
    class Link:
        peer: str
        lanes: int = 1
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from itertools import pairwise
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform, overload

_T = TypeVar("_T")
_MISSING: Any = dataclasses.MISSING


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """The named attributes of an object as one tuple, as dataclasses compare and hash them."""
    if len(names) > 1:
        return attrgetter(*names)
    if names:
        name = names[0]
        return lambda obj: (getattr(obj, name),)
    return lambda obj: ()


class _Table:
    """What the shared methods need to know of one class, worked out once."""

    __slots__ = (
        "accepted",
        "compared",
        "defaults",
        "hashed",
        "later",
        "name",
        "names",
        "positional",
        "post_init",
        "shown",
    )

    def __init__(self, cls: type) -> None:
        fields = dataclasses.fields(cls)
        init = [f for f in fields if f.init]
        positional = [f for f in init if not f.kw_only]
        for before, after in pairwise(positional):
            if _has_default(before) and not _has_default(after):
                raise TypeError(f"non-default argument {after.name!r} follows default argument")
        self.name = cls.__qualname__
        self.names = tuple(f.name for f in init)
        self.positional = tuple(f.name for f in positional)
        self.accepted = {f.name for f in init}
        self.defaults = tuple(_default(f) for f in init if _has_default(f))
        self.later = tuple(_default(f) for f in fields if not f.init and _has_default(f))
        self.shown = tuple(f.name for f in fields if f.repr)
        self.compared = _getter(tuple(f.name for f in fields if f.compare))
        self.hashed = _getter(
            tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))
        )
        self.post_init = hasattr(cls, "__post_init__")


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not _MISSING or f.default_factory is not _MISSING


def _default(f: dataclasses.Field[Any]) -> tuple[str, Any, Any]:
    """The field's name, default and default factory (one of them MISSING)."""
    return f.name, f.default, f.default_factory


def _table(obj: object) -> _Table:
    table: _Table = type(obj).__record_table__  # type: ignore[attr-defined]
    return table


def _init(self: object, *args: Any, **kwargs: Any) -> None:
    table: _Table = type(self).__record_table__  # type: ignore[attr-defined]
    if len(args) > len(table.positional):
        raise TypeError(_too_many(table, len(args)))
    values = dict(zip(table.positional, args, strict=False))  # fewer args than positions
    if kwargs:
        if not kwargs.keys() <= table.accepted or kwargs.keys() & values.keys():
            raise TypeError(_wrong_keyword(table, values, kwargs))
        values.update(kwargs)
    if len(values) < len(table.accepted):
        for name, default, factory in table.defaults:
            if name not in values:
                values[name] = default if factory is _MISSING else factory()
        if len(values) < len(table.accepted):
            raise TypeError(_missing(table, [name for name in table.names if name not in values]))
    for name, default, factory in table.later:
        values[name] = default if factory is _MISSING else factory()
    self.__dict__.update(values)
    if table.post_init:
        self.__post_init__()  # type: ignore[attr-defined]


def _wrong_keyword(table: _Table, given: dict[str, Any], kwargs: dict[str, Any]) -> str:
    """Python's own words for the first keyword argument that is unknown or given twice."""
    for key in kwargs:
        if key not in table.accepted:
            return f"{table.name}.__init__() got an unexpected keyword argument {key!r}"
        if key in given:
            return f"{table.name}.__init__() got multiple values for argument {key!r}"
    raise AssertionError("no wrong keyword among the arguments")


def _too_many(table: _Table, given: int) -> str:
    """Python's own words for too many positional arguments (counting `self`)."""
    most = len(table.positional) + 1
    least = most - sum(1 for name, _, _ in table.defaults if name in table.positional)
    takes = f"{most} positional argument{'s' if most > 1 else ''}"
    if least < most:
        takes = f"from {least} to {most} positional arguments"
    return f"{table.name}.__init__() takes {takes} but {given + 1} were given"


def _missing(table: _Table, missing: list[str]) -> str:
    """Python's own words for missing arguments: the positional ones first, as Python does."""
    positional = [name for name in missing if name in table.positional]
    names, kind = (positional, "positional") if positional else (missing, "keyword-only")
    quoted = [repr(name) for name in names]
    listed = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"
    if len(quoted) > 2:
        listed = f"{', '.join(quoted[:-1])}, and {quoted[-1]}"
    plural = "s" if len(names) > 1 else ""
    count = f"{len(names)} required {kind} argument{plural}"
    return f"{table.name}.__init__() missing {count}: {listed}"


def _repr(self: object) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in _table(self).shown)
    return f"{type(self).__qualname__}({shown})"


def _eq(self: object, other: object) -> object:
    if other.__class__ is not self.__class__:
        return NotImplemented
    compared = _table(self).compared
    return compared(self) == compared(other)


def _hash(self: object) -> int:
    return hash(_table(self).hashed(self))


def _frozen_setattr(self: object, name: str, value: object) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: object, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _build(cls: type[_T], frozen: bool, kw_only: bool, eq: bool) -> type[_T]:
    own = cls.__dict__
    explicit_hash = "__hash__" in own and not (own["__hash__"] is None and "__eq__" in own)
    if not cls.__doc__:  # else dataclasses works one out with inspect.signature, a slow call
        cls.__doc__ = f"{cls.__qualname__}({', '.join(own.get('__annotations__', ()))})"
    # The field table only: no method is generated, so nothing is compiled.
    dataclasses.dataclass(cls, init=False, repr=False, eq=False, kw_only=kw_only)
    cls.__record_table__ = _Table(cls)  # type: ignore[attr-defined]
    methods: dict[str, Any] = {"__init__": _init, "__repr__": _repr}
    if eq:
        methods["__eq__"] = _eq
    for name, method in methods.items():
        if name not in own:
            setattr(cls, name, method)
    if frozen:
        if "__setattr__" in own or "__delattr__" in own:
            raise TypeError(f"frozen record {cls.__qualname__} defines __setattr__ or __delattr__")
        cls.__setattr__ = _frozen_setattr  # type: ignore[method-assign]
        cls.__delattr__ = _frozen_delattr  # type: ignore[method-assign]
    if eq and not explicit_hash:
        cls.__hash__ = _hash if frozen else None  # type: ignore[assignment]
    return cls


@overload
def record(cls: type[_T], /) -> type[_T]: ...


@overload
def record(
    *, frozen: bool = False, kw_only: bool = False, eq: bool = True
) -> Callable[[type[_T]], type[_T]]: ...


@dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
def record(
    cls: type[_T] | None = None, /, *, frozen: bool = False, kw_only: bool = False, eq: bool = True
) -> type[_T] | Callable[[type[_T]], type[_T]]:
    """Make `cls` a dataclass with these options, its methods shared rather than compiled."""
    if cls is not None:
        return _build(cls, frozen, kw_only, eq)
    return lambda cls: _build(cls, frozen, kw_only, eq)
