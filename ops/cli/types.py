"""The argparse value types of every ops command (`rollout`, the drills, the bench, the
simulators, the set makers): each turns one command-line word into a value or rejects it with
an `ArgumentTypeError` whose message names the word and what was expected. Nothing else in
ops/ raises `ArgumentTypeError`. Light on purpose: `rollout kill` imports it."""

from __future__ import annotations

import argparse

from rollout.errors import InvalidChange
from rollout.share import parse_percent


def positive_int(text: str) -> int:
    """A whole number, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def positive_float(text: str) -> float:
    """A finite number above 0."""
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


def bounded_int(low: int, high: int):
    """A whole number within low..high (a bound that keeps a drill from becoming a flood)."""
    def parse(text: str) -> int:
        value = positive_int(text) if low >= 1 else int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} must be within {low}..{high}")
        return value
    return parse


def positive_ints(text: str) -> list[int]:
    """Comma-separated whole numbers, each at least 1, e.g. `1,8,32`."""
    values = [positive_int(part.strip()) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers: {text!r}")
    return values


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


def canary_percent(text: str) -> int:
    """The canary's share as `rollout canary` takes it (`12.5` or `12.5%`), in basis points."""
    try:
        return parse_percent(text.strip().removesuffix("%"))
    except InvalidChange as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def fraction(text: str) -> float:
    """A number from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {text!r}")
    return value


def fractions(text: str) -> tuple[float, ...]:
    """Comma-separated numbers from 0 to 1."""
    return tuple(fraction(part) for part in text.split(","))


def rate_range(text: str) -> tuple[float, float]:
    """`LOW-HIGH` (or one number) per second, 0 < LOW <= HIGH."""
    low, _, high = text.partition("-")
    try:
        pair = float(low), float(high or low)
    except ValueError:
        pair = (0.0, 0.0)
    if not 0 < pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"expected LOW-HIGH pairs per second, got {text!r}")
    return pair


def header_route(text: str) -> tuple[str, tuple[str, ...]]:
    """--header NAME=VALUE[,VALUE...], checked as the state will check it."""
    from rollout.errors import InvalidChange  # light; rollout.header_routes imports pydantic
    from rollout.header_routes import MAX_VALUES, header_problem, parse_header, value_problem

    try:
        name, values = parse_header(text)
    except InvalidChange as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    problem = header_problem(name) or next(filter(None, map(value_problem, values)), None)
    if problem is None and len(values) > MAX_VALUES:
        problem = f"a route has at most {MAX_VALUES} header values, got {len(values)}"
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return name, values


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


def text(what: str):
    """One line of printable text, stripped and not empty; `what` names it in the message."""
    def check(value: str) -> str:
        value = value.strip()
        if not value:
            raise argparse.ArgumentTypeError(f"the {what} must not be empty")
        if not value.isprintable():
            raise argparse.ArgumentTypeError(f"the {what} must be one line of printable text")
        return value
    return check


def key_value(text: str) -> tuple[str, str]:
    """`KEY=VALUE`, the key stripped."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE: {text!r}")
    return key.strip(), value
