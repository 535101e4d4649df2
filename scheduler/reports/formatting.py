"""How the reports write their figures: money with its ISO 4217 code at the currency's minor
unit, GPU-hours and GPUs with one decimal, changes and shares as percentages."""

from __future__ import annotations

import math

ZERO_DECIMAL_CURRENCIES = frozenset(
    {"BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "UYI", "VND",
     "VUV", "XAF", "XOF", "XPF"}
)


def currency_decimals(currency: str) -> int:
    return 0 if currency.upper() in ZERO_DECIMAL_CURRENCIES else 2


def format_money(amount: float, currency: str) -> str:
    """``KRW 75,000,000``, ``USD 1,234.56``: ISO code, space, amount at its minor unit."""
    if amount is None or not math.isfinite(amount):
        return "n/a"
    decimals = currency_decimals(currency)
    text = f"{abs(amount):,.{decimals}f}"
    sign = "-" if round(amount, decimals) < 0 else ""
    return f"{sign}{currency.upper()} {text}"


def format_hours(value: float) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:,.1f}"


format_gpus = format_hours
"""GPU counts are written like hours: one decimal, thousands separators."""


def format_change(value: float) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:+.1%}"


def format_share(value: float) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.1%}"
