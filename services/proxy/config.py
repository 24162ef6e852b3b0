"""Proxy settings: one frozen object built from flags, with AGL_* environment variables as defaults."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from services import settings as st
from services.proxy.call.request_limits import MAX_N_SETTING, MAX_OUTPUT_TOKENS_SETTING, RequestLimits


@dataclass(frozen=True)
class ProxyConfig:
    host: str = "127.0.0.1"  # loopback unless configured (the image sets 0.0.0.0)
    port: int = 8080
    ledger: str = "127.0.0.1:50051"
    model_name: str = ""
    key: str | None = field(default=None, repr=False)
    engine_api_key: str | None = field(default=None, repr=False)
    train_temperature: float | None = 1.0
    val_temperature: float | None = 0.0
    logprobs: bool = True
    retry_attempts: int = 4
    retry_initial_backoff_s: float = 0.1
    retry_max_backoff_s: float = 2.0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 600.0
    # Each engine's weight label is read this often (engines/weight_check.py); 0: never, endpoints routed as registered.
    engine_check_s: float = 2.0
    # A call that finds every engine held back or unreachable (one restarting) waits this long for one. Below the
    # agents' own timeouts: an agent that gave up meanwhile would not see the answer the proxy then records.
    engine_wait_s: float = 20.0
    ledger_timeout_s: float = 10.0
    max_body_bytes: int = 32 * 1024 * 1024
    # What one model call may ask for (call/request_limits.py). Training calls use n=1 (a GRPO group is separate
    # rollouts); 64 answers covers best-of-n and self-consistency agents; 128Ki tokens is above what harnesses
    # send (Claude Code's 32k-64k, OpenAI reasoning models' 100k), so an unmodified agent is not refused.
    max_n: int = 64
    max_output_tokens: int = 131_072
    max_connections: int = 1024  # engine connections (the pool's size)
    max_client_connections: int = 4096  # agents' connections (reduced to what the open-file limit allows)
    header_timeout_s: float = 10.0  # a request head must arrive within this (408 otherwise)
    body_timeout_s: float = 60.0  # and its body within this after the head
    keep_alive_s: float = 75.0  # an idle agent connection is closed after this
    rollout_cache_ttl_s: float = 60.0  # a stale entry costs one engine call at most (see gateway)
    heartbeat_s: float = 2.0
    replica_ttl_s: float = 10.0
    replica_id: str = ""
    workers: int = 1
    log_level: str = "info"
    # Train calls continuing a rollout's turn are sent as the sampled tokens + the new context (token_continuation).
    token_continuation: bool = True
    token_continuation_rollouts: int = 4096  # rollout attempts whose last turns are kept (4 bytes a token)

    @property
    def request_limits(self) -> RequestLimits:
        return RequestLimits(self.max_n, self.max_output_tokens)


_D = ProxyConfig()
_S = st.seconds()
_N = st.integer(1)
SETTINGS = st.Settings(
    "agl-proxy",
    "OpenAI-compatible, token-capturing proxy.",
    [
        st.Setting("--host", "AGL_PROXY_HOST", st.text(), _D.host,
                   "bind address (loopback unless configured; 0.0.0.0 in the image)"),
        st.Setting("--port", "AGL_PROXY_PORT", st.port(), _D.port),
        st.Setting("--ledger", "AGL_LEDGER_ADDR", st.text(nonempty=True), _D.ledger, "ledger gRPC address"),
        st.Setting("--model-name", "AGL_MODEL_NAME", st.text(), _D.model_name,
                   "the model whose endpoints it routes to", shown="required"),
        st.Setting("--key", "AGL_KEY", st.text(empty_is_none=True), _D.key,
                   "master key (agents get per-rollout tokens)", secret=True),
        st.Setting("--engine-api-key", "AGL_ENGINE_API_KEY", st.text(empty_is_none=True), _D.engine_api_key,
                   "key sent to engines", secret=True),
        st.Setting("--train-temperature", "AGL_PROXY_TRAIN_TEMPERATURE", st.optional_number(0.0),
                   _D.train_temperature, "temperature forced in train mode ('keep' leaves the agent's)"),
        st.Setting("--val-temperature", "AGL_PROXY_VAL_TEMPERATURE", st.optional_number(0.0),
                   _D.val_temperature, "temperature forced in val mode ('keep' leaves the agent's)"),
        st.Setting("--logprobs", "AGL_PROXY_LOGPROBS", st.switch(), _D.logprobs, "request log-probs in train mode"),
        st.Setting("--retry-attempts", "AGL_PROXY_RETRY_ATTEMPTS", _N, _D.retry_attempts,
                   "tries of an engine call in all, the first included"),
        st.Setting("--retry-initial-backoff", "AGL_PROXY_RETRY_INITIAL_BACKOFF", st.seconds(zero=True),
                   _D.retry_initial_backoff_s, "ceiling of the first retry's jittered backoff, doubled each retry",
                   name="retry_initial_backoff_s"),
        st.Setting("--retry-max-backoff", "AGL_PROXY_RETRY_MAX_BACKOFF", st.seconds(zero=True),
                   _D.retry_max_backoff_s, "cap of the backoff (an engine's Retry-After included)",
                   name="retry_max_backoff_s"),
        st.Setting("--connect-timeout", "AGL_PROXY_CONNECT_TIMEOUT", _S, _D.connect_timeout_s,
                   "seconds to connect to an engine", name="connect_timeout_s"),
        st.Setting("--read-timeout", "AGL_PROXY_READ_TIMEOUT", _S, _D.read_timeout_s,
                   "longest wait for the engine's answer (between chunks when streaming)", name="read_timeout_s"),
        st.Setting("--engine-check-seconds", "AGL_PROXY_ENGINE_CHECK_SECONDS", st.seconds(zero=True, high=3600),
                   _D.engine_check_s, "how often each engine's weight label is read (GET /weight_info): an engine "
                   "labelled otherwise than registered (restarted), or refusing connections, is held back until it "
                   "agrees; 0: never read, endpoints are routed as registered", name="engine_check_s"),
        st.Setting("--engine-wait-seconds", "AGL_PROXY_ENGINE_WAIT_SECONDS", st.seconds(zero=True, high=3600),
                   _D.engine_wait_s, "how long a call waits for an engine when every one is held back or refuses "
                   "connections (a restart), before a 503 `engine_not_current`; keep it below the agents' "
                   "own timeouts; 0: no wait", name="engine_wait_s"),
        st.Setting("--ledger-timeout", "AGL_PROXY_LEDGER_TIMEOUT", _S, _D.ledger_timeout_s,
                   "seconds one ledger call may take", name="ledger_timeout_s"),
        st.Setting("--max-body-bytes", "AGL_PROXY_MAX_BODY_BYTES", _N, _D.max_body_bytes,
                   "largest request body (413 above)", shown="33554432 (32 MiB)"),
        st.Setting(*MAX_N_SETTING, _N, _D.max_n,
                   "most answers one call may ask for (`n`, completions' `best_of`); more is a 400"),
        st.Setting(*MAX_OUTPUT_TOKENS_SETTING, _N, _D.max_output_tokens,
                   "largest output-token limit one call may ask for (max_tokens, max_completion_tokens, "
                   "max_output_tokens); more is a 400"),
        st.Setting("--max-connections", "AGL_PROXY_MAX_CONNECTIONS", _N, _D.max_connections,
                   "keep-alive connections to the engines"),
        st.Setting("--max-client-connections", "AGL_PROXY_MAX_CLIENT_CONNECTIONS", _N, _D.max_client_connections,
                   "agents' connections served at once; above it the longest-waiting idle one is closed, or 503"),
        st.Setting("--header-timeout", "AGL_PROXY_HEADER_TIMEOUT", _S, _D.header_timeout_s,
                   "seconds a request's head may take to arrive (408 and close otherwise)", name="header_timeout_s"),
        st.Setting("--body-timeout", "AGL_PROXY_BODY_TIMEOUT", _S, _D.body_timeout_s,
                   "seconds a request's body may take to arrive after its head (408 and close otherwise)",
                   name="body_timeout_s"),
        st.Setting("--keep-alive", "AGL_PROXY_KEEP_ALIVE", _S, _D.keep_alive_s,
                   "seconds an idle agent connection is kept open", name="keep_alive_s"),
        st.Setting("--rollout-cache-ttl", "AGL_PROXY_ROLLOUT_CACHE_TTL", st.seconds(zero=True),
                   _D.rollout_cache_ttl_s, "seconds a running rollout's entry is cached", name="rollout_cache_ttl_s"),
        st.Setting("--heartbeat", "AGL_PROXY_HEARTBEAT", _S, _D.heartbeat_s,
                   "seconds between reports to the ledger", name="heartbeat_s"),
        st.Setting("--replica-ttl", "AGL_PROXY_REPLICA_TTL", _S, _D.replica_ttl_s,
                   "seconds a report keeps this replica listed (more than --heartbeat)", name="replica_ttl_s"),
        st.Setting("--replica-id", "AGL_PROXY_REPLICA_ID", st.text(), _D.replica_id,
                   "this replica's name in the ledger", shown="host-pid-random"),
        st.Setting("--workers", "AGL_PROXY_WORKERS", _N, _D.workers, "processes (each its own replica)"),
        st.Setting("--log-level", "AGL_LOG_LEVEL", st.log_level(), _D.log_level),
        st.Setting("--token-continuation", "AGL_PROXY_TOKEN_CONTINUATION", st.switch(), _D.token_continuation,
                   "continue a rollout's earlier turn in the tokens the model sampled, where its history re-renders "
                   "to the same text (needs engines with vLLM's render/generate endpoints: agl-engine starts them)"),
        st.Setting("--token-continuation-rollouts", "AGL_PROXY_TOKEN_CONTINUATION_ROLLOUTS", _N,
                   _D.token_continuation_rollouts,
                   "rollout attempts whose last 4 turns' tokens are kept for token continuation (4 bytes a token; "
                   "least recently used dropped first)"),
    ],
)  # fmt: skip


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> ProxyConfig:
    values = SETTINGS.parse(argv, env)
    if not values["model_name"]:
        SETTINGS.fail("--model-name (or AGL_MODEL_NAME) is required")
    if values["replica_ttl_s"] <= values["heartbeat_s"]:
        SETTINGS.fail("--replica-ttl must exceed --heartbeat, or the replica drops out of the ledger between reports")
    return ProxyConfig(**values)
