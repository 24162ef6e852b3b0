"""KEY=VALUE label arguments."""

from __future__ import annotations

from collections.abc import Iterable

from .errors import USAGE, CliError


def parse_labels(items: Iterable[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--label {item!r}: expected KEY=VALUE", USAGE)
        labels[key] = value
    return labels
