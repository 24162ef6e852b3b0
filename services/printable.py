"""Text that came from agents, made safe to write into a log line or onto a terminal.

An agent chooses what it prints, the rewards' messages it posts, the URLs it registers and what its model says; any
of it may reach the services' logs and `agl`'s output. Written raw, a line break forges a log line of its own, and
escape sequences or BEL act on the operator's terminal (move the cursor, rewrite the screen, set its title).
Control characters (C0, DEL, C1), the Unicode line and paragraph separators and the bidirectional overrides are
written as `\\xNN` / `\\uNNNN` instead; everything else, non-ASCII text included, is kept.
"""

from __future__ import annotations

_UNSAFE = (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_ESCAPES = {c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" for c in _UNSAFE}
_KEEP_LINES = {c: e for c, e in _ESCAPES.items() if c not in (0x09, 0x0A)}


def printable(text: str) -> str:
    """`text` as one line with nothing a terminal acts on: for free text inside a log line or a one-line field."""
    return text.translate(_ESCAPES)


def terminal_text(text: str) -> str:
    """`text` with its line breaks and tabs kept and every other control character escaped: for multi-line output."""
    return text.translate(_KEEP_LINES)
