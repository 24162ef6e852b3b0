"""Declared settings: each one names its flag, its AGL_* environment variable, its kind, default and help, once.

Guarantee: a value that does not fit its kind, given as a flag or as an environment variable, ends the program
with ONE line on stderr naming the flag or the variable, the value and what it wants, and exit status 2
(argparse's usage-error convention), never a traceback. A flag wins over its environment variable, which wins
over the declared default; a default is taken as declared (it is not parsed). Environment values are read only
when the settings are resolved, so a bad variable whose flag is given is never looked at.

Pure and stdlib only: argparse parses the command line, this module turns the strings into values.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


@dataclass(frozen=True)
class Kind:
    """What a value must be: `convert` turns its text into the value or raises ValueError; `wants` says what fits
    ("an integer from 1 to 65535"), in the words of the one-line error."""

    wants: str
    convert: Callable[[str], Any]
    metavar: str | None = None
    switch: bool = False  # an on/off flag: --name / --no-name on the command line
    explains: bool = False  # the ValueError's message says what is wrong (custom kinds)


def text(*, nonempty: bool = False, empty_is_none: bool = False) -> Kind:
    """Any string; `nonempty`: not blank; `empty_is_none`: "" means unset (None), as for keys."""

    def convert(value: str) -> str | None:
        if empty_is_none and not value:
            return None
        if nonempty and not value.strip():
            raise ValueError
        return value

    return Kind("a non-empty string" if nonempty else "a string", convert)


def choice(*values: str, fold_case: bool = False) -> Kind:
    def convert(value: str) -> str:
        folded = value.strip().lower() if fold_case else value
        if folded not in values:
            raise ValueError
        return value

    return Kind("one of " + ", ".join(values), convert, metavar="{" + ",".join(values) + "}")


def log_level() -> Kind:
    """A logging level name in any case (the service upper- or lower-cases it as its logger wants)."""
    return choice(*LOG_LEVELS, fold_case=True)


def integer(low: int | None = None, high: int | None = None, *, what: str = "an integer") -> Kind:
    def convert(value: str) -> int:
        number = int(value)
        if (low is not None and number < low) or (high is not None and number > high):
            raise ValueError
        return number

    wants = "a positive integer" if (low, high, what) == (1, None, "an integer") else _range_words(what, low, high)
    return Kind(wants, convert, metavar="N")


def number(low: float | None = None, high: float | None = None, *, above: bool = False, what: str = "a number") -> Kind:
    """A finite float within [low, high]; `above`: strictly greater than low."""

    def convert(value: str) -> float:
        result = float(value)
        if not math.isfinite(result):
            raise ValueError
        if low is not None and (result <= low if above else result < low):
            raise ValueError
        if high is not None and result > high:
            raise ValueError
        return result

    return Kind(_range_words(what, low, high, above=above), convert, metavar="X")


def seconds(*, zero: bool = False, low: float | None = None, high: float | None = None) -> Kind:
    """A duration: positive (`zero`: or 0), or within [low, high] when they are given."""
    if low is None:
        kind = number(0.0, high, above=not zero, what="a number of seconds")
    else:
        kind = number(low, high, what="a number of seconds")
    return Kind(kind.wants, kind.convert, metavar="SECONDS")


def port(*, zero_is_off: bool = False) -> Kind:
    kind = integer(0 if zero_is_off else 1, 65535, what="a port")
    wants = "a port from 1 to 65535, or 0 (off)" if zero_is_off else kind.wants
    return Kind(wants, kind.convert, metavar="PORT")


def switch() -> Kind:
    def convert(value: str) -> bool:
        word = value.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise ValueError

    return Kind(f"{'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)}", convert, switch=True)


def optional_number(low: float | None = None, *, none_words: Iterable[str] = ("", "none", "keep")) -> Kind:
    """A number, or one of `none_words` (any case) for None."""
    words = tuple(none_words)
    kind = number(low)

    def convert(value: str) -> float | None:
        return None if value.strip().lower() in words else kind.convert(value)

    spelled = " or ".join(repr(w) for w in words if w)
    return Kind(f"{kind.wants}, or {spelled}", convert, metavar="X")


def shell_words() -> Kind:
    """Words split as a POSIX shell would ('--seed 7 --name "a b"')."""
    return Kind("shell words (balanced quotes)", lambda value: tuple(shlex.split(value)))


def custom(wants: str, convert: Callable[[str], Any], metavar: str | None = None) -> Kind:
    """A kind of one's own: `convert` raises ValueError for a value that does not fit; its message, if any, is
    added to the one-line error (say what is wrong without naming the flag: it may have come from the environment)."""
    return Kind(wants, convert, metavar=metavar, explains=True)


def _range_words(what: str, low: float | None, high: float | None, *, above: bool = False) -> str:
    if low is not None and high is not None:
        return f"{what} from {_num(low)} to {_num(high)}"
    if low is not None and above:
        return f"a positive {what.removeprefix('a ').removeprefix('an ')}" if low == 0 else f"{what} above {_num(low)}"
    if low == 0:
        return f"{what}, 0 or more"
    if low is not None:
        return f"{what} of at least {_num(low)}"
    if high is not None:
        return f"{what} of at most {_num(high)}"
    return what


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


@dataclass(frozen=True)
class Setting:
    """One setting. `flag` None: environment only; `env` None: flag only; `name`: the value's key (default: the
    flag without dashes, '-' as '_'); `secret`: its value is never echoed; `shown`: the default as --help says it."""

    flag: str | None
    env: str | None
    kind: Kind
    default: Any
    help: str = ""
    name: str = ""
    secret: bool = False
    shown: str | None = None

    @property
    def key(self) -> str:
        if self.name:
            return self.name
        if self.flag is None:
            raise ValueError("a setting without a flag needs a name")
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def shown_default(self) -> str:
        if self.shown is not None:
            return self.shown
        if self.secret or self.default is None or self.default in ("", (), {}):
            return "none"
        if isinstance(self.default, bool):
            return "on" if self.default else "off"
        return str(self.default)


def fail(prog: str, message: str) -> NoReturn:
    """The one-line usage error: `prog: error: message` on stderr, exit status 2."""
    line = " ".join(message.splitlines())
    sys.stderr.write(f"{prog}: error: {line}\n")
    raise SystemExit(2)


class Settings:
    """A program's declared settings: builds its parser and resolves flags, environment and defaults."""

    def __init__(self, prog: str, description: str, settings: Sequence[Setting], epilog: str | None = None) -> None:
        keys = [s.key for s in settings]
        duplicate = {k for k in keys if keys.count(k) > 1}
        if duplicate:
            raise ValueError(f"settings declared twice: {sorted(duplicate)}")
        self.prog = prog
        self.description = description
        self.epilog = epilog
        self.settings = tuple(settings)

    def parser(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog=self.prog, description=self.description, epilog=self.epilog)
        self.add_flags(parser)
        return parser

    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        """Adds each flag; its value stays the given text (None when not given) until `resolve`."""
        for s in self.settings:
            if s.flag is None:
                continue
            where = f"; env {s.env}" if s.env else ""
            help_text = f"{s.help} ({s.kind.wants}{where}; default {s.shown_default})".lstrip().replace("%", "%%")
            if s.kind.switch:
                parser.add_argument(
                    s.flag, dest=s.key, action=argparse.BooleanOptionalAction, default=None, help=help_text
                )
            else:
                parser.add_argument(s.flag, dest=s.key, default=None, metavar=s.kind.metavar, help=help_text)

    def resolve(self, args: argparse.Namespace, env: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Every setting's value: the flag's, else the environment variable's, else the default. Exits with the
        one-line error for the first value that does not fit."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for s in self.settings:
            given = getattr(args, s.key, None) if s.flag is not None else None
            if isinstance(given, bool):  # a switch given as --name / --no-name
                values[s.key] = given
            elif given is not None:
                values[s.key] = self.convert(s, given, s.flag or s.key)
            elif s.env is not None and s.env in env:
                values[s.key] = self.convert(s, env[s.env], s.env)
            else:
                values[s.key] = s.default
        return values

    def parse(self, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> dict[str, Any]:
        return self.resolve(self.parser().parse_args(argv), env)

    def convert(self, setting: Setting, raw: str, source: str) -> Any:
        try:
            return setting.kind.convert(raw)
        except ValueError as err:
            shown = " (the value given is not shown: a secret)" if setting.secret else f", not {raw!r}"
            why = f": {err}" if setting.kind.explains and str(err) and not setting.secret else ""
            self.fail(f"{source} wants {setting.kind.wants}{shown}{why}")

    def fail(self, message: str) -> NoReturn:
        fail(self.prog, message)
