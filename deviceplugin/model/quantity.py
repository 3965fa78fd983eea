"""Kubernetes quantities (`10Gi`, `1.5G`, `1e9`) as whole numbers, for CEL's `quantity()` and
for the capacities of devices and claims."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from math import ceil

_QUANTITY = re.compile(
    r"([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E))?"
)
_SUFFIX = {
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
}


def parse_quantity(text: str) -> int:
    """A Kubernetes quantity as a whole number, rounded up: `10Gi` -> 10737418240."""
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a quantity")
    number, exponent, suffix = match.groups()
    try:
        value = Decimal(number + (exponent or "")) * _SUFFIX.get(suffix or "", Decimal(1))
    except InvalidOperation as err:
        raise ValueError(f"{text!r} is not a quantity") from err
    return ceil(value)
