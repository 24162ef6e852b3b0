"""Token continuation, the pure part: what a rollout's model already saw, and where its next prompt continues it.

A multi-turn agent sends its whole history as text each turn and the engine re-renders and re-tokenizes it. Where
the model sampled a non-canonical split (`1`,`2` where the tokenizer writes `12`) or ended its turn on a stop token
the text leaves out (`</tool_call>` after a call that did not parse), the re-rendered prompt no longer starts with
the tokens the model produced: the trainer's row breaks there, and the next turn is conditioned on other tokens
than the ones being trained. The proxy remembers each rollout's last few prompt + response token sequences and,
when the next prompt renders to the same text, sends the engine the sampled tokens followed by the newly rendered
context instead (`splice`). A tool call the agent sent back re-serialised (other spacing, key order or escapes: a
client parses the arguments and writes them again, the engine renders them from the parsed object) is the same
call: where the texts differ only inside JSON values that parse equal (`align`), the sampled tokens still stand for
it. Histories that really changed (stripped reasoning, an edited argument, a compacted history) do not render to the
same text and are left as they are: the trainer makes them separate, exact segments.
"""

from __future__ import annotations

import json
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# Outcomes of one continued call (the proxy's agl_proxy_token_continuations counter counts them).
APPENDED = "appended"  # the rendered prompt already starts with what the model saw: sent as it is
SPLICED = "spliced"  # sent as the sampled tokens + the new context
DIVERGED = "diverged"  # the history's text changed: sent as it is (a new segment for the trainer)
UNSUPPORTED = "unsupported"  # the engine has no render/generate endpoints
FAILED = "failed"  # an engine call of the splice failed: sent as it is
OUTCOMES = (APPENDED, SPLICED, DIVERGED, UNSUPPORTED, FAILED)

TURNS_PER_ROLLOUT = 4  # an agent may interleave a few conversations (sub-agents, parallel calls)


@dataclass(frozen=True)
class Turn:
    """One finished call: its prompt + response tokens, and the positions of those among them that no rendering of
    the history contains: a stop token that ended a turn (its text is left out of the answer the agent got) and that
    the template did not write back, kept because the model produced it."""

    tokens: array
    hidden: tuple[int, ...] = ()

    @property
    def stop_token(self) -> int | None:
        """The final token, when it is a hidden stop token."""
        return self.tokens[-1] if self.hidden and self.hidden[-1] == len(self.tokens) - 1 else None

    def visible(self) -> list[int]:
        """The tokens whose text a rendering of the history contains."""
        if not self.hidden:
            return list(self.tokens)
        hidden = set(self.hidden)
        return [token for i, token in enumerate(self.tokens) if i not in hidden]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix. Binary search over slice comparisons: C-speed on arrays and lists."""
    low, high = 0, min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    while low < high:  # invariant: a[:low] == b[:low], a[:high + 1] != b[:high + 1] when high < min length
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


class TokenHistory:
    """The last TURNS_PER_ROLLOUT turns of up to `max_rollouts` rollout attempts, least recently used dropped first
    (a rollout's tokens cost 4 bytes each)."""

    def __init__(self, max_rollouts: int) -> None:
        self.max_rollouts = max_rollouts
        self._turns: OrderedDict[tuple[str, str], list[Turn]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._turns)

    def has(self, key: tuple[str, str]) -> bool:
        return key in self._turns

    def remember(self, key: tuple[str, str], prompt_ids: Sequence[int], response_ids: Sequence[int],
                 stop_token: int | None, prompt_hidden: Sequence[int] = ()) -> None:  # fmt: skip
        """Keeps a finished call: `stop_token` is the token id that stopped it (None for EOS or no stop token),
        `prompt_hidden` the hidden positions of a spliced prompt (Splice.hidden)."""
        if not prompt_ids or not response_ids or self.max_rollouts <= 0:
            return
        try:
            tokens = array("i", prompt_ids)
            tokens.extend(response_ids)
        except OverflowError:  # not a token id (an engine answering nonsense): nothing to continue
            return
        hidden = tuple(prompt_hidden) + ((len(tokens) - 1,) if stop_token == response_ids[-1] else ())
        turns = self._turns.pop(key, None) or []
        # A turn that this one continues is covered by it.
        turns = [t for t in turns if not (len(t.tokens) <= len(tokens) and tokens[: len(t.tokens)] == t.tokens)]
        turns.append(Turn(tokens, hidden))
        self._turns[key] = turns[-TURNS_PER_ROLLOUT:]
        while len(self._turns) > self.max_rollouts:
            self._turns.popitem(last=False)

    def closest(self, key: tuple[str, str], rendered: Sequence[int]) -> tuple[Turn, int] | None:
        """The remembered turn sharing the longest token prefix with `rendered`, and that prefix's length."""
        turns = self._turns.get(key)
        if not turns:
            return None
        self._turns.move_to_end(key)
        try:
            tokens = array("i", rendered)  # an array compares equal to an array only, never to a list
        except OverflowError:
            return None
        return max(((turn, common_prefix(turn.tokens, tokens)) for turn in turns), key=lambda pair: pair[1])


def boundary(offsets: Sequence[Sequence[int]], start: int, length: int) -> int | None:
    """The token index k (>= start) at which the first k tokens cover exactly `length` characters of the rendered
    text, per the renderer's (start, end) character offsets; None when no token ends there."""
    for index in range(start, len(offsets)):
        end = offsets[index][1]
        if end == length:
            return index + 1
        if end > length:
            return None
    return None


# How far back from a difference `align` looks for the JSON value holding it, in parses tried from openers ({ or [)
# that can start JSON: a history holds tool schemas and calls, each object a parse (about 1,500 in 60k characters).
MAX_JSON_PARSES = 4096


def json_equal(a: Any, b: Any) -> bool:
    """Whether two parsed JSON values are the same value: numbers by value (a client may write 2.0 as 2), booleans
    only equal booleans (True == 1 in Python, not in JSON), objects by keys whatever their order."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


_AFTER_OPENER = {"{": frozenset('"}'), "[": frozenset('"{[]-0123456789tfn')}
_JSON_SPACE = " \t\n\r"


def _may_open(text: str, at: int) -> bool:
    """Whether the opener at `at` can start JSON (what follows it can): most braces in prose and code cannot, and a
    failed parse costs as much as the text before it (json counts the lines for its error message)."""
    after = at + 1
    while after < len(text) and text[after] in _JSON_SPACE:
        after += 1
    return after < len(text) and text[after] in _AFTER_OPENER[text[at]]


def _equal_json_around(turn_text: str, rendered_text: str, at: int, shift: int, low: int) -> tuple[int, int] | None:
    """The ends (in turn_text, in rendered_text) of the outermost JSON value that starts at the same place in both
    texts (position p in turn_text, p + shift in rendered_text, p in [low, at]), holds the difference at `at`, and
    parses equal in both; None when the outermost such value differs (or none holds the difference).

    The outermost, not the innermost: an opener inside a JSON string ("print([1,2])") may parse on its own, and
    comparing it alone would take an edited string for a re-spelled one."""
    decoder = json.JSONDecoder()
    found: tuple[int, int] | None = None
    differs = False
    brace, bracket = turn_text.rfind("{", low, at + 1), turn_text.rfind("[", low, at + 1)
    parses = 0
    while parses < MAX_JSON_PARSES:
        p = max(brace, bracket)
        if p < 0:
            break
        if p == brace:  # each kind searched again only once used: the scan stays linear in the text
            brace = turn_text.rfind("{", low, p)
        else:
            bracket = turn_text.rfind("[", low, p)
        if not _may_open(turn_text, p):
            continue
        parses += 1
        try:
            sampled, turn_end = decoder.raw_decode(turn_text, p)
            if turn_end > at:
                sent, rendered_end = decoder.raw_decode(rendered_text, p + shift)
                if rendered_end > at + shift:
                    differs = not json_equal(sampled, sent)
                    found = None if differs else (turn_end, rendered_end)
        except ValueError:
            pass
    return None if differs else found


def align(turn_text: str, rendered_text: str) -> int | None:
    """Where the turn's text ends in `rendered_text`, when the rendered text starts with the turn's text except
    inside JSON values that parse equal (a tool call's arguments re-serialised: compact or spaced, keys reordered,
    `\\u00e9` for `é`); None when it does not (the history changed)."""
    t = r = low = 0
    while True:
        same = common_prefix(turn_text[t:], rendered_text[r:])
        t, r = t + same, r + same
        if t == len(turn_text):
            return r
        ends = _equal_json_around(turn_text, rendered_text, t, r - t, low)
        if ends is None:
            return None
        t, r = ends
        low = t


@dataclass(frozen=True)
class Splice:
    """A continued prompt: `prompt_ids` goes to the engine; `hidden` are the positions in it of tokens no rendering
    contains (see Turn); the others must decode to exactly `text` (the rendered text, with the sampled spelling of
    any re-serialised JSON value), which is checked before it is sent."""

    prompt_ids: list[int]
    hidden: tuple[int, ...]
    text: str = field(default="", compare=False)

    def text_ids(self) -> list[int]:
        return Turn(array("i", self.prompt_ids), self.hidden).visible()


def splice(turn: Turn, rendered: Sequence[int], rendered_text: str, offsets: Sequence[Sequence[int]],
           turn_text: str, shared: int) -> Splice | None:  # fmt: skip
    """The prompt to send: the turn's tokens, then the rendered tokens after the text they stand for.

    `turn_text` is the text of the turn's visible tokens (Turn.visible); `shared` is the tokens' common prefix with
    `rendered`. None when the rendered text does not start with that text (up to re-serialised JSON values, see
    `align`) at a token boundary: the history changed.
    """
    if len(offsets) != len(rendered):
        return None
    end = align(turn_text, rendered_text)
    if end is None:
        return None
    cut = boundary(offsets, max(shared - 1, 0), end)
    if cut is None:
        return None
    tail = list(rendered[cut:])
    tokens = list(turn.tokens)
    hidden = turn.hidden
    stop = turn.stop_token
    if stop is not None and tail[:1] == [stop]:  # the template closed the turn with the same stop token
        tail, hidden = tail[1:], hidden[:-1]
    return Splice([*tokens, *tail], hidden, turn_text + rendered_text[end:])
