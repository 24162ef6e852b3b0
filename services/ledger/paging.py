"""Page sizes and page tokens of the List RPCs (a token is the position to resume from, as decimal text)."""

from __future__ import annotations

from .errors import InvalidArgument


def page_size(requested: int, default: int, maximum: int) -> int:
    if requested < 0:
        raise InvalidArgument("page_size must not be negative")
    return min(requested or default, maximum)


def parse_token(token: str) -> int:
    if not token:
        return 0
    try:
        value = int(token)
    except ValueError:
        raise InvalidArgument(f"page_token {token!r} is not a token this ledger issued") from None
    if value < 0:
        raise InvalidArgument(f"page_token {token!r} is not a token this ledger issued")
    return value
