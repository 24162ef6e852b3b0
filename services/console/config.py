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
