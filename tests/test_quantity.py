"""Kubernetes quantities as `resource.ParseQuantity` reads them, bounded as Kubernetes documents
them (at most 2^63-1 in magnitude): every form it accepts parses, and a number past the bound is
refused from its digits and exponent, before it is built, by the parser and through CEL's
`quantity()`."""

from __future__ import annotations

import pytest

from deviceplugin.explain.selectors import Selector, SelectorError
from deviceplugin.model.quantity import MAX_LENGTH, MAX_MAGNITUDE, parse_quantity
from tests.test_dra_explain import devices

GI = 1 << 30


@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param("7", 7, id="digits"),
        pytest.param("+7", 7, id="plus"),
        pytest.param("-7", -7, id="minus"),
        pytest.param("1.5", 2, id="decimals-rounded-up"),
        pytest.param("-1.5", -1, id="negative-rounded-up"),
        pytest.param("1.", 1, id="trailing-point"),
        pytest.param(".5", 1, id="leading-point"),
        pytest.param("007", 7, id="leading-zeros"),
        pytest.param("0", 0, id="zero"),
        pytest.param("1Ki", 1 << 10, id="Ki"),
        pytest.param("1Mi", 1 << 20, id="Mi"),
        pytest.param("10Gi", 10 * GI, id="Gi"),
        pytest.param("1.5Gi", 3 << 29, id="Gi-decimals"),
        pytest.param("1Ti", 1 << 40, id="Ti"),
        pytest.param("1Pi", 1 << 50, id="Pi"),
        pytest.param("7Ei", 7 << 60, id="Ei"),
        pytest.param("1n", 1, id="n"),
        pytest.param("1u", 1, id="u"),
        pytest.param("500m", 1, id="m"),
        pytest.param("2000m", 2, id="m-whole"),
        pytest.param("2k", 2000, id="k"),
        pytest.param("1M", 10**6, id="M"),
        pytest.param("1.5G", 15 * 10**8, id="G"),
        pytest.param("1T", 10**12, id="T"),
        pytest.param("1P", 10**15, id="P"),
        pytest.param("9E", 9 * 10**18, id="E-is-exa"),
        pytest.param("1e3", 1000, id="exponent"),
        pytest.param("1E3", 1000, id="capital-exponent"),
        pytest.param("1e+3", 1000, id="signed-exponent"),
        pytest.param("15e-1", 2, id="negative-exponent"),
        pytest.param("1e-999999", 1, id="tiny-rounded-up"),
        pytest.param("-1e-999999", 0, id="tiny-negative"),
        pytest.param("0e999999", 0, id="zero-with-a-huge-exponent"),
        pytest.param(" 5Gi ", 5 * GI, id="spaces"),
        pytest.param(str(MAX_MAGNITUDE), MAX_MAGNITUDE, id="2^63-1"),
        pytest.param(f"-{MAX_MAGNITUDE}", -MAX_MAGNITUDE, id="-(2^63-1)"),
        pytest.param("9223372036854775807000m", MAX_MAGNITUDE, id="2^63-1-in-milli"),
    ],
)
def test_every_form_kubernetes_accepts_parses(text: str, value: int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "9223372036854775808",
        "-9223372036854775808",
        "8Ei",
        "9.3E",
        "1e19",
        "1e999999",
        "1e99999999999999999999",
        "-1e999999",
        "0.0000000001e999999",
    ],
)
def test_a_quantity_past_2_63_is_refused_as_out_of_range(text: str) -> None:
    with pytest.raises(ValueError, match=r"is out of range: a quantity is at most 2\^63-1"):
        parse_quantity(text)


@pytest.mark.parametrize(
    "text", ["", ".", "abc", "1Gb", "1e", "1e1.5", "--1", "1.2.3", "Gi", "1 Gi", "\u0663", "0x10"]
)
def test_what_kubernetes_refuses_is_not_a_quantity(text: str) -> None:
    with pytest.raises(ValueError, match="is not a quantity"):
        parse_quantity(text)


def test_a_text_longer_than_any_quantity_is_refused_unread() -> None:
    with pytest.raises(ValueError, match=f"longer than {MAX_LENGTH} characters"):
        parse_quantity("1" * (MAX_LENGTH + 1))
    assert parse_quantity("0" * (MAX_LENGTH - 1) + "1") == 1


def test_cel_quantity_refuses_an_out_of_range_value_as_an_error_of_the_selector() -> None:
    gpu = devices("h100-x8")["gpu-0"]
    with pytest.raises(SelectorError, match="out of range"):
        Selector("quantity('1e99999999') == quantity('1')").matches(gpu)
    assert not Selector("isQuantity('1e99999999')").matches(gpu)
    assert Selector("quantity('1Gi') == quantity('1024Mi')").matches(gpu)
