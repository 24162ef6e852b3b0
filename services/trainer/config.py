"""Trainer settings: one frozen object read from the composed Hydra config (verl's keys + `agl:`).

The Hydra file (config/agl_trainer.yaml) takes its AGL_* environment defaults through `oc.env`, so this
module is the only place the trainer's configuration is interpreted; nothing else reads the environment.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from services import role_map
from services._gen.agl.v1 import rollout_pb2
from services.trainer.data.aggregation import AggregationLevel
from services.trainer.data.guardrails import DEFAULT_LIMITS, Limit, parse_limits
from services.trainer.data.infra_policy import InfraSettings, Policy
from services.trainer.data.settings import DataPathSettings
from services.trainer.judge.group_judge import SCOPE_MISSING, SCOPES, JudgeSettings
from services.trainer.rollouts.manager import ManagerSettings
from services.trainer.rollouts.retention import check_keep_steps
from services.trainer.rollouts.specs import LaunchSettings, check_run_id
from services.trainer.run.lora import trains_adapter

CONFIG_DIR = Path(__file__).resolve().parent / "hydra-conf"
CONFIG_NAME = "agl_trainer"
VERL_CONFIG_RESOLVER = "agl_verl_config_dir"


def verl_config_dir() -> str:
    """verl's Hydra configs (ppo_trainer and its groups), found without importing verl: Hydra's pkg:// source
    imports the package, and verl's __init__ loads torch, transformers and tensordict (~10 s of CPU before
    the trainer's config is even composed)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("verl is not installed here: the trainer needs the trainer extra (agl[trainer])")
    return str(Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config")


# agl_trainer.yaml's search path names verl's configs as file://${agl_verl_config_dir:}. Registered on import:
# every composition of the config (agl-trainer's Hydra main, the tests' compose) imports this module first.
if not OmegaConf.has_resolver(VERL_CONFIG_RESOLVER):
    OmegaConf.register_new_resolver(VERL_CONFIG_RESOLVER, verl_config_dir)

_OUTCOME_ESTIMATORS = frozenset(
    {"grpo", "grpo_vectorized", "grpo_passk", "rloo", "rloo_vectorized", "opo", "gpg", "reinforce_plus_plus",
     "reinforce_plus_plus_baseline"}
)  # fmt: skip


class ConfigError(ValueError):
    """The configuration cannot work with the AGL trainer."""


@dataclass(frozen=True)
class TrainerSettings:
    run_id: str
    ledger_address: str
    key: str | None
    model_name: str
    proxy_admin_url: str | None
    hooks: str | None
    manager: ManagerSettings
    data_path: DataPathSettings
    async_enabled: bool
    drain_timeout_s: float
    pause_lease_s: float
    retry_after_seconds: int
    val_max_samples: int
    # Engines AGL did not start (registered in the ledger) get the weights by file after each update.
    external_engines: bool = False
    weights_dir: str = ""
    # The bearer key of the external engines' /v1 routes (vLLM --api-key); None: they want none.
    engine_api_key: str | None = field(default=None, repr=False)
    # A LoRA run on external engines: the engines load the adapter under model_name (run/lora.py).
    adapter_push: bool = False
    # How often a step's rollouts pause to catch up a restarted external engine; 0: only before each step.
    engine_check_s: float = 2.0
    # JSONL of every consumed rollout with its decoded text (services/trainer/run/trajectory_log.py); None: off.
    trajectory_log: str | None = None
    # Where the best validated weights are kept (services/trainer/run/best.py); None: off.
    best_dir: str | None = None
    # Infrastructure failures out of the advantage (services/trainer/data/infra_policy.py).
    infra: InfraSettings = field(default_factory=InfraSettings)
    # Step-health limits (services/trainer/data/guardrails.py) and how many rollout ids a line names.
    health_limits: Mapping[str, Limit] = field(default_factory=lambda: dict(DEFAULT_LIMITS))
    health_rollouts_named: int = 5
    # Shares over fewer items than this warn instead of stopping the run.
    health_min_count: int = 8
    # Each consumed rollout gets an agl_training_rows event (data/row_records.py; the console's token view); off when
    # agl.retention.keep_steps is 0 (the rollouts are gone by then).
    row_records: bool = True
    # agl.async_training.pause_scope: what the pause around each update holds, "all" calls or the run's "model"'s.
    pause_scope: str = "all"
    # agl.judge: rewards from a judge model (services/trainer/judge/); None: the agents' own.
    judge: JudgeSettings | None = None

    @property
    def pause_model_name(self) -> str:
        """The model the trainer's pause names ("": every call of every proxy)."""
        return self.model_name if self.pause_scope == "model" else ""

    def __repr__(self) -> str:  # never print the key
        key = "***" if self.key else None
        return f"TrainerSettings(run_id={self.run_id!r}, ledger={self.ledger_address!r}, key={key})"


def row_divisor(cfg: Any, data_parallel: int) -> int:
    """What a step's row count must be a multiple of: the data-parallel ranks and, with fixed micro-batches
    (`use_dynamic_bsz: false`), every micro-batch size per GPU the rows go through (old and reference log-probs, the
    update): verl asserts `rows % micro_batch_size_per_gpu == 0` per rank (verl/workers/engine/utils.py)."""
    if bool(_get(cfg, "actor_rollout_ref.actor.use_dynamic_bsz", False)):
        return data_parallel
    sizes = [
        _get(cfg, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
        _get(cfg, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"),
    ]
    if bool(_get(cfg, "actor_rollout_ref.actor.use_kl_loss", False)) or bool(
        _get(cfg, "algorithm.use_kl_in_reward", False)
    ):
        sizes.append(_get(cfg, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"))
    return data_parallel * math.lcm(*(max(int(size or 1), 1) for size in sizes))


def _get(cfg: Any, dotted: str, default: Any = None) -> Any:
    node = cfg
    for part in dotted.split("."):
        if node is None:
            return default
        node = node.get(part) if hasattr(node, "get") else getattr(node, part, None)
    return default if node is None else node


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def infra_settings(agl: Any) -> InfraSettings:
    """agl.infra_failures (and agl.include_failed) -> InfraSettings; ConfigError naming the key."""
    raw = _plain(agl.get("infra_failures")) or {}
    known = ("policy", "retry_attempts", "timeout_is_infra", "step_redos", "redo_wait_seconds")
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(f"agl.infra_failures.{unknown[0]}: unknown key; known: {', '.join(known)}")
    policy_name = str(raw.get("policy", Policy.DROP_ROLLOUT.value))
    try:
        policy = Policy(policy_name)
    except ValueError:
        raise ConfigError(
            f"agl.infra_failures.policy={policy_name}: one of {', '.join(p.value for p in Policy)}"
        ) from None
    attempts = raw.get("retry_attempts", 2)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 100:
        raise ConfigError(f"agl.infra_failures.retry_attempts={attempts!r}: an integer from 1 (no retry) to 100")
    timeout_is_infra = raw.get("timeout_is_infra", False)
    if not isinstance(timeout_is_infra, bool):
        raise ConfigError(f"agl.infra_failures.timeout_is_infra={timeout_is_infra!r}: true or false")
    redos = raw.get("step_redos", 2)
    if isinstance(redos, bool) or not isinstance(redos, int) or not 0 <= redos <= 100:
        raise ConfigError(f"agl.infra_failures.step_redos={redos!r}: an integer from 0 (the run stops) to 100")
    wait_s = raw.get("redo_wait_seconds", 600)
    if isinstance(wait_s, bool) or not isinstance(wait_s, int | float) or not 0 < wait_s <= 86400:
        raise ConfigError(f"agl.infra_failures.redo_wait_seconds={wait_s!r}: seconds, above 0 and at most 86400")
    return InfraSettings(
        policy=policy,
        timeout_is_infra=timeout_is_infra,
        retry_attempts=attempts,
        step_redos=redos,
        redo_wait_s=float(wait_s),
        include_failed=bool(agl.get("include_failed", True)),
    )


def roles_label(agl: Any) -> str:
    """agl.roles -> the label its rollouts carry (services/role_map.py; "" without a map: every call goes to the
    run's own policy whatever model name it sends); ConfigError naming the problem."""
    raw = _plain(agl.get("roles")) or {}
    known = ("map", "frozen", "unmapped")
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(f"agl.roles.{unknown[0]}: unknown key; known: {', '.join(known)}")
    lists = {}
    for key in ("map", "frozen"):
        entries = raw.get(key) or []
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise ConfigError(f"agl.roles.{key}={entries!r}: a list of NAME_PATTERN=POLICY strings")
        lists[key] = entries
    try:
        roles = role_map.from_settings(
            lists["map"], lists["frozen"], str(raw.get("unmapped", role_map.UNMAPPED_POLICY))
        )
    except role_map.RoleMapError as err:
        raise ConfigError(f"agl.roles: {err}") from None
    if not roles.trains(str(agl.model_name)):
        raise ConfigError(
            "agl.roles: unmapped=refuse and no agl.roles.map entry names `policy`: no call would reach this run's "
            "policy, nothing would train"
        )
    return "" if roles.empty else roles.to_label()


def health_settings(agl: Any) -> tuple[dict[str, Limit], int, int]:
    """agl.health -> (limits, rollout ids named per line, min_count); ConfigError naming the key."""
    raw = _plain(agl.get("health")) or {}
    unknown = sorted(set(raw) - {"limits", "rollouts_named", "min_count"})
    if unknown:
        raise ConfigError(f"agl.health.{unknown[0]}: unknown key; known: limits, rollouts_named, min_count")
    try:
        limits = parse_limits(raw.get("limits") or {})
    except ValueError as err:
        raise ConfigError(f"agl.health.{err}") from None
    named = raw.get("rollouts_named", 5)
    if isinstance(named, bool) or not isinstance(named, int) or named < 1:
        raise ConfigError(f"agl.health.rollouts_named={named!r}: an integer >= 1")
    min_count = raw.get("min_count", 8)
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        raise ConfigError(f"agl.health.min_count={min_count!r}: an integer >= 1 (1: any share may stop the run)")
    return limits, named, min_count


_JUDGE_KEYS = (
    "rubric",
    "url",
    "model",
    "key_env",
    "scope",
    "max_tokens",
    "timeout_seconds",
    "attempts",
    "max_answer_chars",
)


def judge_settings(agl: Any, run_id: str, state_dir: Path | None) -> JudgeSettings | None:
    """agl.judge -> JudgeSettings (None: no judge, the agents' rewards); reads the rubric file, and the endpoint's
    key from the variable agl.judge.key_env names. ConfigError naming the key for anything that cannot work."""
    raw = _plain(agl.get("judge")) or {}
    unknown = sorted(set(raw) - set(_JUDGE_KEYS))
    if unknown:
        raise ConfigError(f"agl.judge.{unknown[0]}: unknown key; known: {', '.join(_JUDGE_KEYS)}")
    rubric_file = raw.get("rubric")
    if not rubric_file:
        for name in ("url", "model", "key_env"):
            if raw.get(name):
                raise ConfigError(f"agl.judge.{name} applies to a judge: set agl.judge.rubric to a rubric file")
        return None
    try:
        rubric = Path(str(rubric_file)).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"agl.judge.rubric={rubric_file}: cannot be read ({type(err).__name__}: {err})") from None
    if not rubric.strip():
        raise ConfigError(f"agl.judge.rubric={rubric_file}: the rubric file is empty")
    url = str(raw.get("url") or "") or None
    model = str(raw.get("model") or "")
    key_env = str(raw.get("key_env") or "") or None
    if url is None:
        if model or key_env:
            which = "model" if model else "key_env"
            raise ConfigError(
                f"agl.judge.{which} applies to an external judge (agl.judge.url); without one the run's own policy "
                "judges on its engines (their key: agl.engines.api_key)"
            )
    else:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"agl.judge.url={url}: an http:// or https:// base URL, e.g. https://host/v1")
        if not model:
            raise ConfigError("agl.judge.url needs agl.judge.model: the model the endpoint serves")
    api_key = None
    if key_env:
        api_key = os.environ.get(key_env)
        if not api_key:
            raise ConfigError(f"agl.judge.key_env={key_env}: the environment has no {key_env} (the judge's key)")
    scope = str(raw.get("scope", SCOPE_MISSING))
    if scope not in SCOPES:
        raise ConfigError(f"agl.judge.scope={scope}: `missing` (rollouts without a reward) or `all`")
    numbers = {}
    for name, default, low in (("max_tokens", 1024, 1), ("attempts", 2, 1), ("max_answer_chars", 4000, 1)):
        value = raw.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"agl.judge.{name}={value!r}: an integer >= {low}")
        numbers[name] = value
    timeout_s = raw.get("timeout_seconds", 60)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 < timeout_s <= 3600:
        raise ConfigError(f"agl.judge.timeout_seconds={timeout_s!r}: seconds, above 0 and at most 3600")
    return JudgeSettings(
        rubric_file=str(rubric_file),
        rubric=rubric,
        base_url=url,
        model=model,
        key_env=key_env,
        api_key=api_key,
        scope=scope,
        timeout_s=float(timeout_s),
        cache_path=state_dir / f"{run_id}.judge-cache.jsonl" if state_dir else None,
        **numbers,
    )


def _max_staleness(value: Any, async_enabled: bool) -> int | None:
    """agl.async_training.max_staleness: null, or a number of weight versions >= 0, in asynchronous training only
    (a synchronous step trains only what the weights it updates sampled: the bound would never act)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"agl.async_training.max_staleness={value}: null or a whole number of versions >= 0")
    if not async_enabled:
        raise ConfigError(
            f"agl.async_training.max_staleness={value} bounds asynchronous training, where calls can be sampled by "
            "older weights; set agl.async_training.enable=true or leave it null"
        )
    return value


def settings_from_config(cfg: Any) -> TrainerSettings:
    """Validates the composed config and builds the settings (reads the k8s template file if one is named)."""
    agl = cfg.agl
    run_id = check_run_id(str(agl.run_id))
    estimator = str(_get(cfg, "algorithm.adv_estimator", "grpo"))
    if estimator not in _OUTCOME_ESTIMATORS:
        raise ConfigError(
            f"algorithm.adv_estimator={estimator}: the AGL trainer computes advantages per rollout from its "
            f"reward; use one of {sorted(_OUTCOME_ESTIMATORS)}"
        )
    if _get(cfg, "algorithm.use_kl_in_reward", False):
        raise ConfigError("algorithm.use_kl_in_reward is not supported (rewards are per rollout); use actor KL loss")
    level = AggregationLevel(str(agl.aggregation.level))
    n = int(_get(cfg, "actor_rollout_ref.rollout.n", 1))
    train_batch_size = int(_get(cfg, "data.train_batch_size", 1))
    async_cfg = agl.async_training
    async_enabled = bool(async_cfg.enable)
    async_size = int(async_cfg.async_train_batch_size or train_batch_size)
    if async_enabled and async_size < train_batch_size:
        raise ConfigError(
            f"agl.async_training.async_train_batch_size={async_size} must be >= "
            f"data.train_batch_size={train_batch_size}"
        )
    max_staleness = _max_staleness(async_cfg.get("max_staleness"), async_enabled)
    launch_cfg = agl.launch
    template = ""
    if launch_cfg.get("k8s_job_template_file"):
        template = Path(str(launch_cfg.k8s_job_template_file)).read_text()
    command = tuple(str(x) for x in (launch_cfg.get("command") or []))
    launch = LaunchSettings(
        timeout_seconds=float(launch_cfg.get("timeout_seconds") or 0.0),
        agent_class=str(launch_cfg.get("agent_class") or ""),
        command=command,
        env_map={str(k): str(v) for k, v in (launch_cfg.get("env_map") or {}).items()},
        k8s_job_template=template,
        model_name=str(agl.model_name),
        roles=roles_label(agl),
    )
    infra = infra_settings(agl)
    limits, rollouts_named, min_count = health_settings(agl)
    launch = replace(
        launch,
        retry_attempts=infra.retry_attempts,
        retry_on=tuple(rollout_pb2.FailureReason.Value(f"FAILURE_REASON_{r}") for r in infra.retried_reasons),
    )
    if not (launch.agent_class or launch.command or launch.k8s_job_template):
        raise ConfigError("set agl.launch.agent_class, agl.launch.command or agl.launch.k8s_job_template_file")
    state_dir = agl.get("state_dir")
    retention = agl.get("retention") or {}
    try:
        keep_steps = check_keep_steps(retention.get("keep_steps", 2))
    except ValueError as err:
        raise ConfigError(f"agl.retention.{err}") from err
    manager = ManagerSettings(
        run_id=run_id,
        n=n,
        train_batch_size=train_batch_size,
        mode="async" if async_enabled else "sync",
        async_train_batch_size=async_size,
        launch=launch,
        reward_fillna_value=float(agl.reward_fillna_value),
        keep_steps=keep_steps,
        state_path=Path(str(state_dir)) / f"{run_id}.json" if state_dir else None,
        progress=bool(agl.get("progress", True)),
        validation_call_texts=bool(agl.get("trajectory_log")),
    )
    engines = agl.get("engines") or {}
    external = bool(engines.get("external", False))
    weights_dir = str(engines.get("weights_dir") or "")
    engine_check_s = engines.get("check_seconds", 2.0)
    engine_api_key = str(engines.get("api_key") or "") or None
    # The environment's key is the proxies' too (one .env for the stack): only one set for the trainer is refused.
    if engine_api_key and not external and engine_api_key != os.environ.get("AGL_ENGINE_API_KEY"):
        raise ConfigError(
            "agl.engines.api_key applies to external engines only (agl.engines.external=true); verl's own replicas "
            "take no key"
        )
    if isinstance(engine_check_s, bool) or not isinstance(engine_check_s, int | float) or engine_check_s < 0:
        raise ConfigError(f"agl.engines.check_seconds={engine_check_s!r}: want a number of seconds >= 0 (0: off)")
    if not external and float(engine_check_s) != 2.0:  # the default is in the YAML: only a change is refused
        raise ConfigError(
            "agl.engines.check_seconds applies to external engines only (agl.engines.external=true); verl's own "
            "replicas are restarted with the trainer"
        )
    if external:
        backend = str(_get(cfg, "actor_rollout_ref.rollout.checkpoint_engine.backend", ""))
        if backend != "agl_file":
            raise ConfigError(
                f"agl.engines.external=true needs actor_rollout_ref.rollout.checkpoint_engine.backend=agl_file, "
                f"not {backend!r} (see services/trainer/hydra-conf/placement/cpu.yaml)"
            )
        if not weights_dir or not Path(weights_dir).is_absolute():
            raise ConfigError(
                f"agl.engines.weights_dir={weights_dir!r}: set an absolute directory the engines can read"
            )
    model_cfg = _get(cfg, "actor_rollout_ref.model", {}) or {}
    if not external and trains_adapter(model_cfg):
        # verl's replicas load the adapter for verl's own agent loop; the agents' HTTP calls name the model, which
        # those replicas serve as the base: every rollout would sample from the base model, silently.
        raise ConfigError(
            "actor_rollout_ref.model.lora_rank > 0 trains an adapter that AGL pushes to external engines "
            "(agl.engines.external=true, as placement=cpu sets); with verl's own replicas set "
            "actor_rollout_ref.model.lora.merge=true (the merged weights are pushed) or train without LoRA"
        )
    nodes = int(_get(cfg, "trainer.nnodes", 1))
    gpus = int(_get(cfg, "trainer.n_gpus_per_node", 1))
    data_path = DataPathSettings(
        level=level,
        max_prompt_length=int(agl.aggregation.max_prompt_length),
        max_response_length=int(agl.aggregation.max_response_length),
        pad_token_id=int(agl.aggregation.get("pad_token_id", 0)),
        adv_estimator=estimator,
        norm_adv_by_std_in_grpo=bool(_get(cfg, "algorithm.norm_adv_by_std_in_grpo", True)),
        mini_batch_rows=int(_get(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size", 0)) * n,
        max_ppo_update_times=int(agl.max_ppo_update_times),
        row_divisor=row_divisor(cfg, max(nodes * gpus, 1)),
        max_staleness=max_staleness,
    )
    return TrainerSettings(
        run_id=run_id,
        ledger_address=str(agl.ledger_address),
        key=str(agl.key) if agl.get("key") else None,
        model_name=str(agl.model_name),
        proxy_admin_url=str(agl.proxy_admin_url) if agl.get("proxy_admin_url") else None,
        hooks=str(agl.hooks) if agl.get("hooks") else None,
        manager=manager,
        data_path=data_path,
        async_enabled=async_enabled,
        drain_timeout_s=float(async_cfg.drain_timeout_seconds),
        pause_lease_s=_pause_lease_s(async_cfg),
        retry_after_seconds=int(async_cfg.retry_after_seconds),
        val_max_samples=int(agl.get("val_max_samples", 0) or 0),
        external_engines=external,
        weights_dir=weights_dir,
        engine_api_key=engine_api_key,
        adapter_push=external and trains_adapter(model_cfg),
        engine_check_s=float(engine_check_s),
        trajectory_log=str(agl.trajectory_log) if agl.get("trajectory_log") else None,
        best_dir=_best_dir(agl.get("best_dir"), cfg),
        infra=infra,
        health_limits=limits,
        health_rollouts_named=rollouts_named,
        health_min_count=min_count,
        row_records=bool(agl.get("row_records", True)) and keep_steps != 0,
        pause_scope=_pause_scope(async_cfg),
        judge=judge_settings(agl, run_id, Path(str(state_dir)) if state_dir else None),
    )


def _best_dir(value: Any, cfg: Any) -> str | None:
    """agl.best_dir: an absolute folder, and only where there is a validation to pick the best by."""
    if not value:
        return None
    if not Path(str(value)).is_absolute():
        raise ConfigError(f"agl.best_dir={value!r}: set an absolute folder")
    if not _get(cfg, "data.val_files", None) or int(_get(cfg, "trainer.test_freq", -1)) <= 0:
        raise ConfigError(
            "agl.best_dir keeps the weights of the best validation: set data.val_files and trainer.test_freq > 0 "
            "(or leave agl.best_dir unset)"
        )
    return str(value)


def _pause_scope(async_cfg: Any) -> str:
    """agl.async_training.pause_scope: `all` (the pause around an update holds every proxy call) or `model` (only
    the calls of this run's rollouts, routed to agl.model_name: for several runs sharing proxies and engines)."""
    scope = str(async_cfg.get("pause_scope", "all"))
    if scope not in ("all", "model"):
        raise ConfigError(f"agl.async_training.pause_scope={scope}: `all` or `model`")
    return scope


def _pause_lease_s(async_cfg: Any) -> float:
    """agl.async_training.pause_lease_seconds: the lease of the trainer's pause of the proxies (renewed every
    third of it while the update runs; 0: no lease, the pause holds until the trainer resumes)."""
    value = float(async_cfg.get("pause_lease_seconds", 60))
    if not 0 <= value <= 86400:
        raise ConfigError(f"agl.async_training.pause_lease_seconds={value:g}: a number of seconds from 0 to 86400")
    return value
