"""Declared settings (services/settings.py): the kinds, flag > environment > default, and the one-line error.

The last tests start every service's installed command with a bad environment variable and with a bad flag: each
must exit 2 with one line on stderr naming the variable or flag and the value, and no traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from services import settings as st
from services.cli import app as cli_app
from services.cli import config as cli_config
from services.console import config as console_config
from services.controller import config as controller_config
from services.engine import config as engine_config
from services.ledger import config as ledger_config
from services.proxy import config as proxy_config
from services.standin import config as standin_config
from tools import gen_settings_docs

ALL = {
    "agl": cli_config.SETTINGS,
    "agl-console": console_config.SETTINGS,
    "agl-controller": controller_config.SETTINGS,
    "agl-engine": engine_config.SETTINGS,
    "agl-ledger": ledger_config.SETTINGS,
    "agl-proxy": proxy_config.SETTINGS,
    "agl-standin-engine": standin_config.SETTINGS,
}


def refused(kind: st.Kind, text: str) -> bool:
    try:
        kind.convert(text)
    except ValueError:
        return True
    return False


def test_integer_and_port_ranges() -> None:
    assert st.integer(1).convert("7") == 7 and refused(st.integer(1), "0") and refused(st.integer(1), "1e6")
    assert refused(st.integer(1, 10), "11") and st.integer(1, 10).convert(" 10 ") == 10
    assert st.port().convert("65535") == 65535
    for bad in ("0", "65536", "99999", "-1", "abc", ""):
        assert refused(st.port(), bad), bad
    assert st.port(zero_is_off=True).convert("0") == 0 and refused(st.port(zero_is_off=True), "-1")
    assert st.port().wants == "a port from 1 to 65535" and st.integer(1).wants == "a positive integer"


def test_numbers_and_seconds_are_finite_and_in_range() -> None:
    assert st.number(0.0, 1.0).convert("0.5") == 0.5 and refused(st.number(0.0, 1.0), "1.5")
    for bad in ("nan", "inf", "-inf", "x", ""):
        assert refused(st.number(), bad), bad
    assert st.seconds().convert("1e-3") == 0.001
    assert refused(st.seconds(), "0") and refused(st.seconds(), "-2")
    assert st.seconds(zero=True).convert("0") == 0.0 and refused(st.seconds(zero=True), "-0.1")
    assert st.seconds(low=0.3, high=3600).convert("0.3") == 0.3 and refused(st.seconds(low=0.3, high=3600), "0.2")
    assert st.seconds().wants == "a positive number of seconds"
    assert st.seconds(zero=True).wants == "a number of seconds, 0 or more"


def test_switches_choices_texts_and_words() -> None:
    for word in ("1", "true", "YES", " on "):
        assert st.switch().convert(word) is True
    for word in ("0", "False", "no", "off"):
        assert st.switch().convert(word) is False
    assert refused(st.switch(), "maybe") and refused(st.switch(), "")
    assert st.choice("text", "json").convert("json") == "json" and refused(st.choice("text", "json"), "JSON")
    assert st.log_level().convert("DEBUG") == "DEBUG" and refused(st.log_level(), "loud")
    assert st.text().convert("") == "" and refused(st.text(nonempty=True), "  ")
    assert st.text(empty_is_none=True).convert("") is None and st.text(empty_is_none=True).convert("k") == "k"
    assert st.optional_number(0.0).convert("keep") is None and st.optional_number(0.0).convert("0.7") == 0.7
    assert refused(st.optional_number(0.0), "-1") and refused(st.optional_number(0.0), "warm")
    assert st.shell_words().convert('--seed 7 --name "a b"') == ("--seed", "7", "--name", "a b")
    assert refused(st.shell_words(), '--name "a b')


SPEC = st.Settings(
    "prog",
    "a test program",
    [
        st.Setting("--port", "T_PORT", st.port(), 8000, "where it listens"),
        st.Setting("--ratio", "T_RATIO", st.number(0.0, 1.0), 0.5, "100% is 1"),
        st.Setting("--key", "T_KEY", st.text(empty_is_none=True), None, secret=True),
        st.Setting("--pin", "T_PIN", st.integer(1000, 9999), 1234, secret=True),
        st.Setting("--fast", "T_FAST", st.switch(), False),
        st.Setting("--pair", None, st.custom("A:B", lambda v: tuple(v.split(":")) if ":" in v else int("x")), ()),
        st.Setting(None, "T_WORDS", st.shell_words(), (), name="words"),
    ],
)


def test_flag_wins_over_environment_which_wins_over_the_default() -> None:
    assert SPEC.parse([], {}) == {"port": 8000, "ratio": 0.5, "key": None, "pin": 1234, "fast": False, "pair": (),
                                  "words": ()}  # fmt: skip
    env = {"T_PORT": "9000", "T_FAST": "yes", "T_KEY": "", "T_WORDS": "a 'b c'"}
    got = SPEC.parse([], env)
    assert (got["port"], got["fast"], got["key"], got["words"]) == (9000, True, None, ("a", "b c"))
    got = SPEC.parse(["--port", "9100", "--no-fast", "--pair", "x:y"], env)
    assert (got["port"], got["fast"], got["pair"]) == (9100, False, ("x", "y"))


def test_a_bad_variable_under_a_given_flag_is_never_read() -> None:
    assert SPEC.parse(["--port", "1"], {"T_PORT": "abc"})["port"] == 1
    assert SPEC.parse(["--fast"], {"T_FAST": "maybe"})["fast"] is True


def error_line(capsys: pytest.CaptureFixture[str], argv: list[str], env: dict[str, str]) -> str:
    with pytest.raises(SystemExit) as info:
        SPEC.parse(argv, env)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.endswith("\n") and err.count("\n") == 1, err
    return err.strip()


def test_a_bad_value_is_one_line_naming_its_source_value_and_what_it_wants(capsys: pytest.CaptureFixture[str]):
    assert error_line(capsys, [], {"T_PORT": "abc"}) == "prog: error: T_PORT wants a port from 1 to 65535, not 'abc'"
    assert error_line(capsys, ["--port", "99999"], {}) == (
        "prog: error: --port wants a port from 1 to 65535, not '99999'"
    )
    assert error_line(capsys, [], {"T_RATIO": "nan"}) == "prog: error: T_RATIO wants a number from 0 to 1, not 'nan'"
    assert "a\\nb" in error_line(capsys, [], {"T_WORDS": "a\nb '"})  # a newline in the value stays on the line
    assert error_line(capsys, ["--pair", "nope"], {}).startswith("prog: error: --pair wants A:B, not 'nope': ")


def test_a_secret_value_is_never_echoed(capsys: pytest.CaptureFixture[str]) -> None:
    line = error_line(capsys, ["--pin", "12"], {})
    assert line == "prog: error: --pin wants an integer from 1000 to 9999 (the value given is not shown: a secret)"


def test_help_names_each_variable_default_and_kind(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        SPEC.parse(["--help"], {"T_PORT": "abc"})  # help works whatever the environment holds
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "where it listens (a port from 1 to 65535; env T_PORT; default 8000)" in out
    assert "100% is 1" in out and "--fast, --no-fast" in out and "default off" in out


def test_fail_is_one_line_and_a_setting_is_declared_once(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        SPEC.fail("two\nlines")
    assert info.value.code == 2 and capsys.readouterr().err == "prog: error: two lines\n"
    with pytest.raises(ValueError, match="declared twice"):
        st.Settings("p", "", [st.Setting("--a", None, st.text(), ""), st.Setting("--b", None, st.text(), "", name="a")])


@pytest.mark.parametrize("prog", sorted(ALL))
def test_every_declared_default_is_a_value_its_kind_accepts(prog: str) -> None:
    flags = [s.flag for s in ALL[prog].settings if s.flag]
    assert len(flags) == len(set(flags))
    for s in ALL[prog].settings:
        assert s.env is None or s.env.startswith("AGL_"), s
        if (isinstance(s.default, (bool, int, float, str)) and s.default != "") or (s.default is None and s.secret):
            text = "" if s.default is None else str(s.default)
            assert s.kind.convert(text) == s.default, s


def test_services_defaults_are_their_config_objects_defaults() -> None:
    assert ledger_config.parse_args([], {}) == ledger_config.LedgerConfig()
    assert proxy_config.parse_config(["--model-name", "m"], {}) == proxy_config.ProxyConfig(model_name="m")
    assert engine_config.parse_config(["--model-dir", "/m"], {}) == engine_config.EngineConfig(model_dir="/m")
    assert console_config.parse_args(["--key", "k"], {}) == console_config.ConsoleConfig(key="k")
    assert standin_config.parse_config([], {}) == standin_config.StandinConfig()
    parser = __import__("argparse").ArgumentParser()
    cli_config.add_global_flags(parser)
    assert cli_config.from_args(parser.parse_args([]), {}) == cli_config.CliConfig()


def test_unusable_values_that_were_accepted_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    cases = [
        (lambda: proxy_config.parse_config(["--model-name", "m"], {"AGL_PROXY_HEARTBEAT": "0"}), "AGL_PROXY_HEARTBEAT"),
        (lambda: proxy_config.parse_config(["--model-name", "m", "--replica-ttl", "1"], {}), "--replica-ttl"),
        (lambda: ledger_config.parse_args(["--port", "99999"], {}), "--port"),
        (lambda: ledger_config.parse_args([], {"AGL_LEDGER_GRACE_SECONDS": "-1"}), "AGL_LEDGER_GRACE_SECONDS"),
        (lambda: controller_config.load_config(["--job-ttl", "-5"], {}), "--job-ttl"),
        (lambda: controller_config.load_config([], {"AGL_CONTROLLER_LAUNCHER_LEARN": "sometimes"}),
         "AGL_CONTROLLER_LAUNCHER_LEARN"),
        (lambda: engine_config.parse_config(["--model-dir", "/m"], {"AGL_ENGINE_EXTRA_ARGS": "'"}),
         "AGL_ENGINE_EXTRA_ARGS"),
        (lambda: standin_config.parse_config(["--chunk-delay-ms", "-1"], {}), "--chunk-delay-ms"),
    ]  # fmt: skip
    for call, name in cases:
        with pytest.raises(SystemExit) as info:
            call()
        err = capsys.readouterr().err
        assert info.value.code == 2 and err.count("\n") == 1 and name in err, err


def test_controller_custom_values_say_what_is_wrong_without_naming_the_flag(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        controller_config.load_config([], {"AGL_CONTROLLER_LABEL_SELECTOR": "run=r1,novalue"})
    assert capsys.readouterr().err == (
        "agl-controller: error: AGL_CONTROLLER_LABEL_SELECTOR wants k=v,k2=v2, not 'run=r1,novalue': "
        "'novalue' is not key=value\n"
    )


# Each service's installed command (pyproject's [project.scripts]): a bad variable, then a bad flag.
COMMANDS = {
    "agl-ledger": ([], ("AGL_LEDGER_PORT", "abc"), ["--port", "99999"]),
    "agl-proxy": (["--model-name", "m"], ("AGL_PROXY_MAX_BODY_BYTES", "1e6"), ["--heartbeat", "0"]),
    "agl-controller": ([], ("AGL_CONTROLLER_LEASE_TTL", "abc"), ["--max-concurrency", "0"]),
    "agl-engine": (["--model-dir", "/m"], ("AGL_ENGINE_PORT", "99999"), ["--kv-cache-gib", "0"]),
    "agl-console": (["--key", "k"], ("AGL_CONSOLE_PAGE_SIZE", "lots"), ["--port", "-1"]),
    "agl-standin-engine": ([], ("AGL_STANDIN_DELAY_MS", "-5"), ["--mistake-rate", "2"]),
    "agl": (["rollouts"], ("AGL_CLI_TIMEOUT", "0"), ["--timeout", "abc"]),
}


def run_command(prog: str, argv: list[str], extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")} | extra_env
    command = str(Path(sys.executable).parent / prog)
    return subprocess.run([command, *argv], env=env, capture_output=True, text=True, timeout=60, check=False)


def assert_one_line_usage_error(result: subprocess.CompletedProcess[str], prog: str, name: str, value: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prog}: error: {name} wants ") and f"not {value!r}" in lines[0], lines[0]


@pytest.mark.parametrize("prog", sorted(COMMANDS))
def test_each_service_refuses_a_bad_variable_and_a_bad_flag_in_one_line(prog: str) -> None:
    base, (variable, value), bad_flag = COMMANDS[prog]
    flag_first = prog == "agl"  # agl's global flags come before the subcommand
    assert_one_line_usage_error(run_command(prog, base, {variable: value}), prog, variable, value)
    argv = [*bad_flag, *base] if flag_first else [*base, *bad_flag]
    assert_one_line_usage_error(run_command(prog, argv, {}), prog, bad_flag[0], bad_flag[1])


# The reference pages' settings tables (docs/reference/*.md) are generated from the declarations
# (tools/gen_settings_docs.py, `make docs-tables`): they must be what the declarations give, every program has one,
# and the hand-written prose around them names only flags that exist.
REPO = Path(__file__).resolve().parents[1]
DOCS = "\n".join(
    path.read_text() for path in [*sorted((REPO / "docs").rglob("*.md")), REPO / "SECURITY.md", REPO / "README.md"]
)
# Flags the reference pages name that belong to no AGL program, each with what it is.
FOREIGN_FLAGS = {
    "--enable-auto-tool-choice": "vLLM's, set by agl-engine",
    "--enable-scale-out": "vLLM's, set by agl-engine",
    "--worker-extension-cls": "vLLM's, set by agl-engine",
    "--profile": "docker compose's",
    "--quick": "tools/demo.py's (make demo ARGS=...)",
}


def documented(name: str) -> bool:
    if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", DOCS):
        return True
    if name.startswith("--") and f"--[no-]{name[2:]}" in DOCS:
        return True
    wildcards = re.findall(r"AGL_[A-Z_]*\*[A-Z_]*", DOCS)
    return any(re.fullmatch(w.replace("*", "[A-Z_]+"), name) for w in wildcards)


def test_the_reference_tables_are_the_declarations() -> None:
    stale = gen_settings_docs.stale_pages()
    assert not stale, (
        f"settings tables differ from the declarations: run 'make docs-tables' and commit: {sorted(stale)}"
    )


def test_a_changed_declaration_makes_its_table_stale() -> None:
    page, module = "docs/reference/ledger.md", "services.ledger.config"
    text = (REPO / page).read_text()
    declared = gen_settings_docs.settings_of(module)
    port = next(s for s in declared.settings if s.flag == "--port")
    changed = st.Settings(declared.prog, declared.description, [
        dataclasses.replace(s, default=50052) if s is port else s for s in declared.settings
    ])  # fmt: skip
    fresh = gen_settings_docs.render(text, changed, module, page)
    assert fresh != text and "| `--port` `PORT` | `AGL_LEDGER_PORT` | a port from 1 to 65535 | `50052` |" in fresh


def test_every_program_has_a_generated_reference_table() -> None:
    tabled = {gen_settings_docs.settings_of(module).prog for module in gen_settings_docs.PAGES.values()}
    assert tabled == set(ALL)
    for page, module in gen_settings_docs.PAGES.items():
        rows = table_rows(page, module)
        assert len(rows) == len(gen_settings_docs.settings_of(module).settings), page


def table_rows(page: str, module: str) -> list[str]:
    text = (REPO / page).read_text()
    prog = gen_settings_docs.settings_of(module).prog
    block = text[text.index(gen_settings_docs.BEGIN.format(prog=prog, module=module)) :]
    block = block[: block.index(gen_settings_docs.END)]
    return [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| flag |")]


def options_of(parser: argparse.ArgumentParser) -> set[str]:
    """Every long option of a parser and of its subcommands' parsers."""
    found = set()
    for action in parser._actions:
        found |= {o for o in action.option_strings if o.startswith("--")}
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= options_of(sub)
    return found


@pytest.mark.parametrize("page", sorted(gen_settings_docs.PAGES))
def test_reference_prose_names_only_flags_that_exist(page: str) -> None:
    module = gen_settings_docs.PAGES[page]
    prog = gen_settings_docs.settings_of(module).prog
    text = (REPO / page).read_text()
    start = text.index(gen_settings_docs.BEGIN.format(prog=prog, module=module))
    prose = text[:start] + text[text.index(gen_settings_docs.END, start) :]
    own = options_of(cli_app.build_parser()) if prog == "agl" else {s.flag for s in ALL[prog].settings if s.flag}
    anyone = {s.flag for settings in ALL.values() for s in settings.settings if s.flag}
    for name in set(re.findall(r"(?<![\w-])--(?:\[no-\])?[a-z][a-z0-9-]*\*?", prose)):
        flag = name.replace("[no-]", "")
        if flag.startswith("--no-") and "--" + flag[5:] in own | anyone:
            flag = "--" + flag[5:]
        if flag.endswith("-*"):
            assert any(f.startswith(flag[:-1]) for f in own), f"{page}: {name} matches no flag of {prog}"
            continue
        assert flag in own or flag in anyone or flag in FOREIGN_FLAGS, f"{page}: names {name}, which is not declared"


@pytest.mark.parametrize("prog", sorted(ALL))
def test_every_declared_flag_and_variable_is_documented(prog: str) -> None:
    missing = [name for s in ALL[prog].settings for name in (s.flag, s.env) if name and not documented(name)]
    assert not missing, f"{prog}: not in docs/, README.md or SECURITY.md: {missing}"
