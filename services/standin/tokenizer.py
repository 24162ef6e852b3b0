"""Deterministic toy tokenizer and log-probs.

Text splits into pieces of optional leading whitespace plus a run of non-space characters, so joining the pieces
gives the text back. A piece's id is derived from its bytes; the id -> piece table is kept so ids decode. Log-probs
are a pure function of (token id, position), so tests can recompute exactly what the engine returned.
"""

from __future__ import annotations

import re
import zlib

_PIECE = re.compile(r"\s*\S+|\s+$")
VOCAB_OFFSET = 1000
VOCAB_SIZE = 100_000
# The end-of-sequence token, below the pieces' ids: the token-in generate endpoint ends a finished answer with it, as
# vLLM does; decoding leaves it out (a special token), as vLLM's /detokenize does.
EOS_ID = 2


class ToyTokenizer:
    def __init__(self) -> None:
        self._pieces: dict[int, str] = {}

    def split(self, text: str) -> list[str]:
        return _PIECE.findall(text)

    def token_id(self, piece: str) -> int:
        token = VOCAB_OFFSET + zlib.crc32(piece.encode()) % VOCAB_SIZE
        self._pieces.setdefault(token, piece)
        return token

    def encode(self, text: str) -> list[int]:
        return [self.token_id(piece) for piece in self.split(text)]

    def decode_piece(self, token: int) -> str:
        return self._pieces.get(token, f"<{token}>")

    def decode(self, tokens: list[int]) -> str:
        """The text of token ids, special tokens (EOS) left out."""
        return "".join(self.decode_piece(token) for token in tokens if token != EOS_ID)

    def offsets(self, tokens: list[int]) -> list[tuple[int, int]]:
        """Each token's (start, end) characters in the decoded text, as vLLM's renderer reports them."""
        spans, at = [], 0
        for token in tokens:
            width = 0 if token == EOS_ID else len(self.decode_piece(token))
            spans.append((at, at + width))
            at += width
        return spans


def token_logprob(token: int, position: int) -> float:
    """Log-prob of `token` sampled at `position`: a multiple of 1/1024 in (-4, 0], exact in JSON and float64."""
    return -((token * 7919 + position * 104_729) % 4096) / 1024


def alternatives(token: int, position: int, count: int) -> list[tuple[int, float]]:
    """`count` made-up alternative tokens with log-probs below the sampled one's."""
    base = token_logprob(token, position)
    return [(VOCAB_OFFSET + (token * 31 + k * 977) % VOCAB_SIZE, base - (k + 1) * 0.5) for k in range(count)]
