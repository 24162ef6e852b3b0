"""Trainer settings: one frozen object read from the composed Hydra config (verl's keys + `agl:`).

The Hydra file (config/agl_trainer.yaml) takes its AGL_* environment defaults through `oc.env`, so this
module is the only place the trainer's configuration is interpreted; nothing else reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .adapter import DataPathSettings
from .aggregation import AggregationLevel
from .manager import ManagerSettings
from .retention import check_keep_steps
from .specs import LaunchSettings, check_run_id

CONFIG_DIR = Path(__file__).resolve().parent / "hydra-conf"
CONFIG_NAME = "agl_trainer"

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
    retry_after_seconds: int
    val_max_samples: int
    # Engines AGL did not start (registered in the ledger) get the weights by file after each update.
    external_engines: bool = False
    weights_dir: str = ""
    # JSONL of every consumed rollout with its decoded text (services/trainer/trajectory_log.py); None: off.
    trajectory_log: str | None = None

    def __repr__(self) -> str:  # never print the key
        key = "***" if self.key else None
        return f"TrainerSettings(run_id={self.run_id!r}, ledger={self.ledger_address!r}, key={key})"


def _get(cfg: Any, dotted: str, default: Any = None) -> Any:
    node = cfg
    for part in dotted.split("."):
        if node is None:
            return default
        node = node.get(part) if hasattr(node, "get") else getattr(node, part, None)
    return default if node is None else node


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
        include_failed=bool(agl.include_failed),
        keep_steps=keep_steps,
        state_path=Path(str(state_dir)) / f"{run_id}.json" if state_dir else None,
        progress=bool(agl.get("progress", True)),
    )
    engines = agl.get("engines") or {}
    external = bool(engines.get("external", False))
    weights_dir = str(engines.get("weights_dir") or "")
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
        row_divisor=max(nodes * gpus, 1),
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
        retry_after_seconds=int(async_cfg.retry_after_seconds),
        val_max_samples=int(agl.get("val_max_samples", 0) or 0),
        external_engines=external,
        weights_dir=weights_dir,
        trajectory_log=str(agl.trajectory_log) if agl.get("trajectory_log") else None,
    )
