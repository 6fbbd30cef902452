"""Sampling temperatures as users write them and as files key them: one parser, one key.

``parse_temperatures("0,0.7,1")`` -> ``[0.0, 0.7, 1.0]`` is the rule of every ``--temperatures``
option; :func:`temperature_key` (``0``, ``0.7``, ``1``) keys per-temperature plan files and
reports. Standard library only, so any module may import it.
"""

from __future__ import annotations

import math

__all__ = ["parse_temperatures", "temperature_key"]


def temperature_key(temperature: float) -> str:
    """The mapping key of a temperature: ``0``, ``0.7``, ``1``.

    Raises:
        ValueError: the temperature is negative or not finite.
    """
    t = float(temperature)
    if not math.isfinite(t) or t < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    return f"{t:g}"


def parse_temperatures(text: str) -> list[float]:
    """``"0,0.7,1"`` -> ``[0.0, 0.7, 1.0]``; each finite and >= 0, no repeats.

    Raises:
        ValueError: the list is empty, has a non-number, a negative or non-finite value or a repeat.
    """
    temps = []
    for part in text.split(","):
        if not part.strip():
            continue
        try:
            t = float(part)
        except ValueError:
            raise ValueError(f"temperatures must be comma-separated numbers, got {part.strip()!r}") from None
        if not math.isfinite(t) or t < 0:
            raise ValueError(f"a temperature must be finite and >= 0, got {part.strip()!r}")
        temps.append(t)
    if not temps:
        raise ValueError("give at least one temperature")
    keys = [temperature_key(t) for t in temps]
    if len(set(keys)) != len(keys):
        raise ValueError(f"repeated temperature in {text!r}")
    return temps
