"""What the settings of start-up tracing and the features it starts share: the error that
names a bad value, byte sizes, and the warning line on stderr.

It imports no other alloctrace module, so that :mod:`alloctrace._startup` (which reads the
settings and starts everything) and the features it starts (:mod:`alloctrace._memory_limit`)
both build on it without importing each other both ways.
"""

from __future__ import annotations

import sys

#: The largest byte count a size setting can name (a limit is kept in 64 bits).
MAX_SIZE = (1 << 64) - 1

#: Values shown in an error message are cut to this many characters.
_SHOWN_MAX = 200

#: Size suffixes, all binary: ``k`` and ``KB`` mean KiB, as in allocator settings.
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
    "tib": 1 << 40,
    "p": 1 << 50,
    "pb": 1 << 50,
    "pib": 1 << 50,
    "e": 1 << 60,
    "eb": 1 << 60,
    "eib": 1 << 60,
}


class ConfigError(ValueError):
    """An ALLOCTRACE variable or ``-X alloctrace`` option has a value we cannot use."""


def _shown(value: str) -> str:
    """*value*'s repr for an error line, cut short if it is long."""
    text = repr(value)
    return text if len(text) <= _SHOWN_MAX else text[: _SHOWN_MAX - 5] + "...'"


def parse_size(value: str) -> int | None:
    """Parse a byte count such as ``524288``, ``512KiB``, ``512k``, ``2MiB`` or ``1.5 MB``.

    Units are case-insensitive and binary (``k``, ``KB`` and ``KiB`` all mean 1024 bytes;
    ``m``, ``g``, ``t``, ``p`` and ``e`` likewise); a fraction is rounded to whole bytes, so
    that equal amounts give equal counts however written (``1TiB``, ``1024GiB``). Return
    ``None`` if *value* is not such a count; callers check the range.
    """
    text = value.strip()
    number = text.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ").rstrip()
    unit = text[len(number) :].strip().lower()
    if (
        unit not in _SIZE_UNITS
        or not number
        or not number.isascii()
        or not all(c.isdigit() or c == "." for c in number)
    ):
        return None
    if len(number) > 60 or number.count(".") > 1:
        # 2**64 has 20 digits: longer is out of every range, and int() has a digit limit.
        return None
    if "." not in number:
        return int(number, 10) * _SIZE_UNITS[unit]
    if number == ".":
        return None
    from fractions import Fraction

    # Exact, as a float would not be: 18446744073709551615.0 is 2**64-1, not 2**64.
    return round(Fraction(number) * _SIZE_UNITS[unit])


def _warn(message: str) -> None:
    try:
        sys.stderr.write(f"alloctrace: {message}\n")
        sys.stderr.flush()
    except Exception:
        # stderr closed or broken: there is no one left to tell.
        pass
