"""`record` against `dataclasses.dataclass`: each class shape declared both ways must behave the
same (constructor, defaults, repr, equality, hash, frozenness, `replace`, `asdict`), and
declaring one compiles no code."""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deviceplugin.model.record import record


def declare(decorator: Any) -> dict[str, type]:
    """The same classes, made by `decorator` (dataclass or record, with options)."""

    @decorator(frozen=True)
    class Frozen:
        name: str
        size: int = 1
        tags: tuple[str, ...] = ()
        extra: dict[str, int] = field(default_factory=dict, compare=False, hash=False)

    @decorator()
    class Mutable:
        name: str
        items: list[int] = field(default_factory=list)
        hidden: str = field(default="", repr=False)

    @decorator(frozen=True, kw_only=True)
    class Base:
        kind: ClassVar[str] = "base"
        level: str = "info"

    @decorator(frozen=True, kw_only=True)
    class Derived(Base):
        kind: ClassVar[str] = "derived"
        path: str
        count: int = 0

    @decorator(eq=False)
    class Identity:
        value: int

    @decorator()
    class Checked:
        low: int
        high: int

        def __post_init__(self) -> None:
            if self.low > self.high:
                raise ValueError(f"{self.low} > {self.high}")

    return {c.__name__: c for c in (Frozen, Mutable, Base, Derived, Identity, Checked)}


DATACLASS = declare(dataclasses.dataclass)
RECORD = declare(record)

CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("Frozen", ("a",), {}),
    ("Frozen", ("a", 2, ("x",)), {}),
    ("Frozen", ("a",), {"tags": ("y", "z"), "extra": {"k": 1}}),
    ("Frozen", (), {"name": "b", "size": 3}),
    ("Mutable", ("m",), {}),
    ("Mutable", ("m", [1, 2]), {"hidden": "h"}),
    ("Base", (), {}),
    ("Derived", (), {"path": "/p"}),
    ("Derived", (), {"path": "/p", "count": 2, "level": "debug"}),
    ("Identity", (1,), {}),
    ("Checked", (1, 2), {}),
]
BAD_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("Frozen", (), {}),
    ("Mutable", (), {}),
    ("Checked", (), {}),
    ("Checked", (1, 2, 3), {}),
    ("Frozen", ("a", 1, (), {}, "more"), {}),
    ("Frozen", ("a",), {"name": "b"}),
    ("Frozen", ("a",), {"colour": "red"}),
    ("Derived", ("/p",), {}),
    ("Derived", (), {}),
]


def make(table: dict[str, type], name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return table[name](*args, **kwargs)


def shown(obj: Any) -> str:
    """repr without the module-qualified local class name, which differs by declaration."""
    return repr(obj).split("(", 1)[1]


@pytest.mark.parametrize(("name", "args", "kwargs"), CALLS)
def test_each_shape_behaves_as_its_dataclass(
    name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    ours, theirs = make(RECORD, name, args, kwargs), make(DATACLASS, name, args, kwargs)
    assert shown(ours) == shown(theirs)
    assert repr(ours).startswith(f"{type(ours).__qualname__}(")
    assert dataclasses.asdict(ours) == dataclasses.asdict(theirs)
    names = [f.name for f in dataclasses.fields(ours)]
    assert names == [f.name for f in dataclasses.fields(theirs)]
    twin = make(RECORD, name, args, kwargs)
    if name == "Identity":
        assert ours != twin and hash(ours) != hash(twin)
        return
    assert ours == twin
    assert not ours != twin  # noqa: SIM202 (__ne__ comes from __eq__)
    assert ours != theirs  # another class, however alike
    if type(theirs).__dataclass_params__.frozen:  # type: ignore[attr-defined]
        assert hash(ours) == hash(twin) == hash(theirs)
        with pytest.raises(dataclasses.FrozenInstanceError):
            ours.name = "other"
        with pytest.raises(dataclasses.FrozenInstanceError):
            del ours.name
    else:
        assert type(ours).__hash__ is None and type(theirs).__hash__ is None


@pytest.mark.parametrize(("name", "args", "kwargs"), BAD_CALLS)
def test_bad_arguments_fail_as_the_dataclass_does(
    name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    with pytest.raises(TypeError) as theirs:
        make(DATACLASS, name, args, kwargs)
    with pytest.raises(TypeError) as ours:
        make(RECORD, name, args, kwargs)
    assert str(ours.value) == str(theirs.value)


def test_replace_defaults_and_post_init() -> None:
    frozen = RECORD["Frozen"]("a")
    changed = dataclasses.replace(frozen, size=5)
    assert (changed.name, changed.size, frozen.size) == ("a", 5, 1)
    first, second = RECORD["Mutable"]("x"), RECORD["Mutable"]("y")
    first.items.append(1)
    assert second.items == []  # a fresh list from the factory each time
    assert RECORD["Frozen"]("a", extra={"k": 1}) == RECORD["Frozen"]("a")  # compare=False
    with pytest.raises(ValueError, match="3 > 2"):
        RECORD["Checked"](3, 2)
    assert RECORD["Derived"](path="/p").kind == "derived"


def test_declaring_one_compiles_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled: list[str] = []
    real_exec = exec

    def counting_exec(source: Any, *args: Any) -> None:
        compiled.append(str(source))
        real_exec(source, *args)

    monkeypatch.setattr("builtins.exec", counting_exec)
    declare(record)
    assert compiled == []
    declare(dataclasses.dataclass)
    assert compiled  # the yardstick does compile, so the count above can fail


def test_a_required_field_after_a_default_is_refused() -> None:
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):

        @record
        class Broken:
            a: int = 0
            b: int  # type: ignore[misc]


def test_explicit_methods_are_kept() -> None:
    @record(frozen=True)
    class Named:
        name: str

        def __repr__(self) -> str:
            return f"<{self.name}>"

        def __hash__(self) -> int:
            return 7

    assert repr(Named("n")) == "<n>" and hash(Named("n")) == 7


@given(st.text(), st.integers(), st.lists(st.text(), max_size=3))
def test_equal_values_equal_records(name: str, size: int, tags: list[str]) -> None:
    ours = RECORD["Frozen"](name, size, tuple(tags))
    theirs = DATACLASS["Frozen"](name, size, tuple(tags))
    assert hash(ours) == hash(theirs)
    assert ours == RECORD["Frozen"](name, size, tuple(tags))
    assert ours != RECORD["Frozen"](name + "x", size, tuple(tags))


def test_a_class_without_a_docstring_gets_its_fields_as_one() -> None:
    @record
    class Bare:
        first: int
        second: str = ""

    assert (
        Bare.__doc__
        == "test_a_class_without_a_docstring_gets_its_fields_as_one.<locals>.Bare(first, second)"
    )
