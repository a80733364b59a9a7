"""Value checkers for everything read from outside: settings, requests, the app's controls and trace files.

Each checker takes a value and the name to call it by, returns the value (whole numbers as int, real ones as
float) and refuses anything else with an `InvalidRequest` whose message is one sentence: "<name> must be <what
is allowed>; got <the value, shortly>." A number is checked for its type first (a bool is not a number, text is
not a number), then for finiteness and range. `tokenswift.validate` uses them at the API, CLI and UI boundaries;
`tokenswift.serve.export` uses them on trace files, where `exact=True` takes JSON's own types only (3.0 is not a
whole number there: the file's columns are kept as read) and the caller puts "In the trace file, " before the
sentence.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from numbers import Integral, Real
from typing import Any, NoReturn

LOG10_2 = math.log10(2)


class InvalidRequest(ValueError):
    """A value refused at a boundary; the message is one sentence meant for the person who gave it."""


def refuse(message: str) -> NoReturn:
    raise InvalidRequest(message)


def shown(value: Any) -> str:
    """A short rendering of a refused value (never megabytes of it)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"a number of {digits(value)} digits"
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:37]) + "..."
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    return f"a value of type {type(value).__name__}"


def digits(value: int) -> int:
    """Decimal digits of a whole number, without writing it out (Python refuses str() beyond 4,300 digits)."""
    value = abs(value)
    count = max(1, int(value.bit_length() * LOG10_2))  # the count, or one less
    return count + 1 if value >= 10**count else count


def _number_text(x: float) -> str:
    """1e9 as 1,000,000,000 and 0.5 as 0.5 in a range's wording."""
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


# ---- one value ---------------------------------------------------------------------------------------------
def whole_number(value: Any, name: str, low: int, high: int, allowed: str | None = None, exact: bool = False) -> int:
    """An int from low to high; also a float without a fraction, such as 3.0, unless `exact`. `allowed` words
    the range (default "from LOW to HIGH")."""
    allowed = allowed or f"from {low:,} to {high:,}"
    if isinstance(value, bool) or not isinstance(value, Real):
        refuse(f"{name} must be a number: a whole one {allowed}; got {shown(value)}.")
    if isinstance(value, Integral):
        number = int(value)
    elif not exact and math.isfinite(value) and float(value).is_integer():
        number = int(value)
    else:
        refuse(f"{name} must be a whole number {allowed}; got {shown(value)}.")
    if not low <= number <= high:
        refuse(f"{name} must be a whole number {allowed}; got {shown(number)}.")
    return number


def real_number(value: Any, name: str, ok: Callable[[float], bool], allowed: str) -> float:
    """A finite int or float for which ok(value) holds; `allowed` words the range."""
    if isinstance(value, bool) or not isinstance(value, Real):
        refuse(f"{name} must be a number: {allowed}; got {shown(value)}.")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or not ok(number):
        refuse(f"{name} must be a number {allowed}; got {shown(value)}.")
    return number


def number_between(value: Any, name: str, low: float, high: float, allowed: str | None = None) -> float:
    """A finite number from low to high (high may be infinite: no upper bound)."""
    if allowed is None:
        allowed = (f"of at least {_number_text(low)}" if high == math.inf
                   else f"from {_number_text(low)} to {_number_text(high)}")
    return real_number(value, name, lambda x: low <= x <= high, allowed)


def true_or_false(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        refuse(f"{name} must be true or false; got {shown(value)}.")
    return value


def one_of(value: Any, name: str, options: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in options:
        refuse(f"{name} must be one of {', '.join(map(str, options))}; got {shown(value)}.")
    return value


def a_string(value: Any, name: str, max_len: float = math.inf, empty: bool = True) -> str:
    """A string of at most max_len characters (and not empty unless `empty`)."""
    if not isinstance(value, str):
        refuse(f"{name} must be text; got {shown(value)}.")
    if len(value) > max_len:
        refuse(f"{name} must be text of at most {max_len:,} characters; got {len(value):,} characters.")
    if not empty and not value:
        refuse(f"{name} must be text that is not empty; got ''.")
    return value


# ---- containers (JSON's lists and objects) -----------------------------------------------------------------
def a_list(value: Any, name: str, max_len: int) -> list[Any]:
    if not isinstance(value, list):
        refuse(f"{name} must be a list; got {shown(value)}.")
    if len(value) > max_len:
        refuse(f"{name} has {len(value):,} entries; at most {max_len:,} are allowed.")
    return value


def a_pair(value: Any, name: str) -> list[Any]:
    items = a_list(value, name, 2)
    if len(items) != 2:
        refuse(f"{name} must be a pair of two values; got {len(items)}.")
    return items


def same_length(value: Any, other: list[Any], name: str, what: str) -> list[Any]:
    """A list with one entry per entry of `other` (`what` names those: "tokens", "iterations")."""
    items = a_list(value, name, len(other))
    if len(items) != len(other):
        refuse(f"{name} has {len(items):,} entries for {len(other):,} {what}.")
    return items


def an_object(value: Any, name: str, required: Iterable[str], optional: Iterable[str] = ()) -> dict[str, Any]:
    """A dict with every `required` key and no key outside `required` and `optional`."""
    if not isinstance(value, dict):
        refuse(f"{name} must be an object; got {shown(value)}.")
    required, known = tuple(required), {*required, *optional}
    unknown = next((k for k in value if k not in known), None)
    if unknown is not None:
        refuse(f"{name} has the unknown key {shown(unknown)}.")
    missing = next((k for k in required if k not in value), None)
    if missing is not None:
        refuse(f"{name} lacks the key {missing!r}.")
    return value


def whole_numbers(items: list[Any], name: str, low: int, high: int) -> None:
    """Every entry an int (exactly) from low to high; the first that is not is named as name[k]. Fast on
    long columns: one pass of type checks, then min and max."""
    if all(type(v) is int for v in items) and (not items or (low <= min(items) and max(items) <= high)):
        return
    for k, v in enumerate(items):
        if type(v) is not int or not low <= v <= high:
            whole_number(v, f"{name}[{k}]", low, high, exact=True)


def numbers_between(items: list[Any], name: str, low: float, high: float) -> None:
    """Every entry a number from low to high; the first that is not is named as name[k]."""
    for k, v in enumerate(items):
        if type(v) not in (int, float) or not low <= v <= high:
            number_between(v, f"{name}[{k}]", low, high)


def each_one_of(items: list[Any], name: str, options: tuple[str, ...]) -> None:
    """Every entry one of `options`; the first that is not is named as name[k]."""
    allowed = {str(o) for o in options}
    for k, v in enumerate(items):
        if type(v) is not str or v not in allowed:
            one_of(v, f"{name}[{k}]", options)
