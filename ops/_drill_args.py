"""Argument types of the drill's options: each rejects a bad value with a message naming it."""

from __future__ import annotations

import argparse


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def seconds(high: float = 600.0):
    """A positive number of seconds, at most `high` (a drill stays bounded in time)."""
    def parse(text: str) -> float:
        value = positive_float(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"{text!r} must be at most {high:g} s")
        return value
    return parse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return value


def bounded_int(low: int, high: int):
    """A whole number within low..high (a bound that keeps a drill from becoming a flood)."""
    def parse(text: str) -> int:
        value = positive_int(text) if low >= 1 else int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} must be within {low}..{high}")
        return value
    return parse


def factors(text: str) -> list[float]:
    """Comma-separated multiples of capacity, each above 0 and at most 100, e.g. `2,5,10`."""
    values = [positive_float(part.strip()) for part in text.split(",") if part.strip()]
    if not values or len(values) > 10 or max(values) > 100:
        raise argparse.ArgumentTypeError("give 1 to 10 numbers up to 100, e.g. 2,5,10")
    return values


def client_counts(text: str) -> list[int]:
    """Comma-separated client counts, each 1..1000, e.g. `1,2,4,8,16`."""
    values = [positive_int(part.strip()) for part in text.split(",") if part.strip()]
    if not values or len(values) > 10 or max(values) > 1000:
        raise argparse.ArgumentTypeError("give 1 to 10 client counts up to 1000, e.g. 1,2,4")
    return values


def percent(text: str) -> float:
    """A share in percent, 0..100."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{text!r} must be within 0..100")
    return value


def niceness(text: str) -> int | str:
    """`auto`, `none` or a niceness within -20..19."""
    if text in ("auto", "none"):
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not auto, none or a whole number") from None
    if not -20 <= value <= 19:
        raise argparse.ArgumentTypeError(f"{text!r} must be within -20..19")
    return value
