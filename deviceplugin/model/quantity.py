"""Kubernetes quantities (`10Gi`, `1.5G`, `1e9`) as whole numbers, for CEL's `quantity()` and
for the capacities of devices and claims.

Read as Kubernetes' `resource.ParseQuantity` reads them: a signed decimal number (`1`, `1.5`,
`1.`, `.5`), then a binary suffix (Ki to Ei), a decimal one (n, u, m, k, M, G, T, P, E) or an
exponent (`e9`, `E-3`). Bounded as Kubernetes documents them: no quantity is more than 2^63-1
in magnitude. The bound is checked from the digits and the exponent before the number is built,
in whole-number arithmetic, so `1e999999` is refused at once instead of being computed; a text
longer than any quantity within the bound needs is refused unread."""

from __future__ import annotations

import re

MAX_MAGNITUDE = 2**63 - 1  # Kubernetes' Quantity: "no quantity may represent a number greater"
MAX_LENGTH = 64  # 19 digits, 9 decimals, a sign, an exponent: 64 leaves room for zeros

_QUANTITY = re.compile(
    r"([+-]?)([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?"
)
_TWOS = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_TENS = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DIGITS = len(str(MAX_MAGNITUDE))  # 19


def parse_quantity(text: str) -> int:
    """A Kubernetes quantity as a whole number, rounded up: `10Gi` -> 10737418240. Raises
    ValueError for a text that is not a quantity or one more than 2^63-1 in magnitude."""
    if len(text) > MAX_LENGTH:
        raise ValueError(f"{text[:20]!r}... is not a quantity: longer than {MAX_LENGTH} characters")
    match = _QUANTITY.fullmatch(text.strip())
    if match is None or not (match[2] or match[3]):
        raise ValueError(f"{text!r} is not a quantity (such as 10Gi, 1.5G or 1e9)")
    sign, whole, fraction, exponent, suffix = match.groups()
    digits = int(whole + (fraction or "") or "0")
    if digits == 0:
        return 0
    ten = int(exponent or 0) + _TENS.get(suffix, 0) - len(fraction or "")
    two = _TWOS.get(suffix, 0)
    # 10^(len - 1 + ten) <= |value| < 10^(len + ten) * 2^two, with 2^two < 10^19
    order = len(str(digits)) - 1 + ten
    if order >= _DIGITS:
        raise _out_of_range(text)
    if order < -2 * _DIGITS:  # a fraction of one, whatever the binary suffix
        return 0 if sign == "-" else 1
    numerator: int = (digits << two) * 10 ** max(ten, 0)
    denominator: int = 10 ** max(-ten, 0)
    if numerator > MAX_MAGNITUDE * denominator:
        raise _out_of_range(text)
    whole_part, rest = divmod(numerator, denominator)
    if sign == "-":
        return -whole_part
    return whole_part + (1 if rest else 0)


def _out_of_range(text: str) -> ValueError:
    return ValueError(
        f"{text!r} is out of range: a quantity is at most 2^63-1 ({MAX_MAGNITUDE}) in magnitude"
    )
