"""Tiny evaluation requests shared by the bench and sweep tests (one tool, gold calls)."""

from __future__ import annotations

from ooospec.data.request import Request

CITIES = ["Paris", "Lyon", "Oslo", "Rome", "Bern", "Nice"]
WEATHER_TOOL = {"name": "get_weather", "description": "Weather of a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def weather_requests(prefix: str, n: int) -> list[Request]:
    """``n`` requests named ``<prefix>-<i>`` (the benchmark is ``prefix``) asking one city's weather."""
    return [Request(f"{prefix}-{i}", prefix, "eval", [{"role": "user", "content": f"Weather in {CITIES[i % 6]}?"}],
                    [WEATHER_TOOL], [{"name": "get_weather", "arguments": {"city": CITIES[i % 6]}}]) for i in range(n)]
