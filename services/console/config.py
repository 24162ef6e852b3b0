"""Console settings: one frozen object from flags with AGL_* environment defaults (keys are never logged)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services import settings as st


@dataclass(frozen=True)
class ConsoleConfig:
    host: str = "127.0.0.1"  # localhost unless asked otherwise
    port: int = 8090
    ledger: str = "127.0.0.1:50051"
    key: str | None = None  # the master key: the ledger's bearer key, also accepted at the login page
    console_key: str | None = None  # a read-only key accepted at the login page only
    page_size: int = 100
    header_timeout_s: float = 10.0  # a request head must arrive within this (408 otherwise)
    body_timeout_s: float = 30.0  # and its body within this after the head
    max_connections: int = 512  # connections served at once (open pages hold one each for their event stream)
    ledger_check_s: float = 5.0  # one cheap call to the ledger this often: the pages say when it does not answer
    log_level: str = "INFO"

    @property
    def login_keys(self) -> tuple[str, ...]:
        return tuple(k for k in (self.key, self.console_key) if k)


_D = ConsoleConfig()
SETTINGS = st.Settings(
    "agl-console",
    "AGL web console (reads the ledger over gRPC).",
    [
        st.Setting("--host", "AGL_CONSOLE_HOST", st.text(), _D.host, "bind address (localhost unless asked otherwise)"),
        st.Setting("--port", "AGL_CONSOLE_PORT", st.port(), _D.port),
        st.Setting("--ledger", "AGL_LEDGER_ADDR", st.text(nonempty=True), _D.ledger, "ledger gRPC address"),
        st.Setting("--key", "AGL_KEY", st.text(empty_is_none=True), _D.key,
                   "master key (the ledger's key, also accepted at the login page)", secret=True),
        st.Setting("--console-key", "AGL_CONSOLE_KEY", st.text(empty_is_none=True), _D.console_key,
                   "read-only key accepted at the login page", secret=True),
        st.Setting("--page-size", "AGL_CONSOLE_PAGE_SIZE", st.integer(1, 1000), _D.page_size,
                   "rows per rollouts page"),
        st.Setting("--header-timeout", "AGL_CONSOLE_HEADER_TIMEOUT", st.seconds(), _D.header_timeout_s,
                   "seconds a request's head may take to arrive (408 and close otherwise)", name="header_timeout_s"),
        st.Setting("--body-timeout", "AGL_CONSOLE_BODY_TIMEOUT", st.seconds(), _D.body_timeout_s,
                   "seconds a request's body may take to arrive after its head (408 and close otherwise)",
                   name="body_timeout_s"),
        st.Setting("--max-connections", "AGL_CONSOLE_MAX_CONNECTIONS", st.integer(1), _D.max_connections,
                   "connections served at once (each open page holds one); above it the longest-waiting idle one is "
                   "closed, or 503"),
        st.Setting("--ledger-check-seconds", "AGL_CONSOLE_LEDGER_CHECK_SECONDS", st.seconds(low=0.5, high=3600),
                   _D.ledger_check_s, "seconds between the console's checks that the ledger answers (each with a "
                   "deadline of 0.6 of it, at least 1 s); the pages say when it does not", name="ledger_check_s"),
        st.Setting("--log-level", "AGL_LOG_LEVEL", st.log_level(), _D.log_level),
    ],
)  # fmt: skip


def parse_args(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> ConsoleConfig:
    values = SETTINGS.parse(argv, env)
    if not values["key"] and not values["console_key"]:
        SETTINGS.fail(
            "the console shows nothing without a login key: set --key/AGL_KEY or --console-key/AGL_CONSOLE_KEY"
        )
    return ConsoleConfig(**{**values, "log_level": values["log_level"].upper()})
