"""Start-up check of the composed trainer config, before Ray or a GPU is touched.

Refuses the combinations that cannot work on verl 0.9.1's GPU path (or that would train silently wrong)
with a ConfigError of one line: the key, its value, why, and the value to set. Pure: it reads the config
(resolving its interpolations on the calling host) and nothing else; no files, no Ray, no GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import PurePosixPath
from typing import Any

from omegaconf import OmegaConf

from services.trainer.config import ConfigError

# verl's data defaults (its ppo_trainer.yaml): gsm8k prompts, not agent tasks.
VERL_DEFAULT_DATA_DIR = "~/data/rlhf/gsm8k/"
# Engines whose servers take the served model name and tool-call flags through rollout.engine_kwargs.
SUPPORTED_ENGINES = ("vllm", "sglang")

_ROLLOUT = "actor_rollout_ref.rollout"


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    """The value at a dotted key, None when absent, null or `???`."""
    value = OmegaConf.select(cfg, key, default=default, throw_on_missing=False)
    return default if value is None else value


def _fmt(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if OmegaConf.is_config(value):
        return str(OmegaConf.to_container(value, resolve=True))
    return str(value)


def _files(value: Any) -> list[str]:
    if value is None:
        return []
    if OmegaConf.is_list(value) or isinstance(value, list | tuple):
        return [str(v) for v in value]
    return [str(value)]


def _rollout_name(cfg: Any) -> Iterator[str]:
    name = _get(cfg, f"{_ROLLOUT}.name")
    if name is None:
        yield f"{_ROLLOUT}.name=null: verl starts no inference engine without it; set {_ROLLOUT}.name=vllm"
    elif str(name) not in SUPPORTED_ENGINES:
        yield (
            f"{_ROLLOUT}.name={name}: the AGL trainer serves agl.model_name only through "
            f"{' or '.join(SUPPORTED_ENGINES)}; set {_ROLLOUT}.name=vllm"
        )


def _external_engines(cfg: Any) -> bool:
    """Engines AGL did not start (placement=cpu, a separate deployment): verl starts no rollout server."""
    return bool(_get(cfg, "agl.engines.external", False))


def _gpus_vs_parallelism(cfg: Any) -> Iterator[str]:
    nodes = int(_get(cfg, "trainer.nnodes", 1))
    per_node = int(_get(cfg, "trainer.n_gpus_per_node", 1))
    gpus = nodes * per_node
    if gpus < 1:
        yield f"trainer.n_gpus_per_node={per_node}, trainer.nnodes={nodes}: the GPU path needs a GPU; set both >= 1"
        return
    if _external_engines(cfg):
        return
    tp = int(_get(cfg, f"{_ROLLOUT}.tensor_model_parallel_size", 1))
    others = int(_get(cfg, f"{_ROLLOUT}.data_parallel_size", 1)) * int(
        _get(cfg, f"{_ROLLOUT}.pipeline_model_parallel_size", 1)
    )
    if tp < 1 or gpus % (tp * others):
        fitting = max((t for t in range(1, max(tp, 1) + 1) if gpus % (t * others) == 0), default=1)
        yield (
            f"{_ROLLOUT}.tensor_model_parallel_size={tp}: one engine needs {tp * others} GPUs, which does not "
            f"divide the {gpus} GPUs of trainer.nnodes={nodes} x trainer.n_gpus_per_node={per_node}; "
            f"set {_ROLLOUT}.tensor_model_parallel_size={fitting}"
        )


def _exactly_one(cfg: Any, section: str, name: str, suggestion: int) -> Iterator[str]:
    legacy, per_gpu = _get(cfg, f"{section}.{name}"), _get(cfg, f"{section}.{name}_per_gpu")
    if legacy is None and per_gpu is None:
        yield f"{section}.{name}_per_gpu=null: verl needs a micro-batch size; set {section}.{name}_per_gpu={suggestion}"
    elif legacy is not None and per_gpu is not None:
        yield (
            f"{section}.{name}={legacy}: set together with {section}.{name}_per_gpu={per_gpu}, which verl refuses; "
            f"set {section}.{name}=null"
        )


def _batch_sizes(cfg: Any) -> Iterator[str]:
    actor = "actor_rollout_ref.actor"
    if bool(_get(cfg, f"{actor}.use_dynamic_bsz", False)):
        return
    yield from _exactly_one(cfg, actor, "ppo_micro_batch_size", 4)
    yield from _exactly_one(cfg, _ROLLOUT, "log_prob_micro_batch_size", 8)
    uses_ref = bool(_get(cfg, "algorithm.use_kl_in_reward", False)) or bool(_get(cfg, f"{actor}.use_kl_loss", False))
    if uses_ref:
        yield from _exactly_one(cfg, "actor_rollout_ref.ref", "log_prob_micro_batch_size", 8)
    train = int(_get(cfg, "data.train_batch_size", 1))
    mini = int(_get(cfg, f"{actor}.ppo_mini_batch_size", train))
    if mini > train:
        yield (
            f"{actor}.ppo_mini_batch_size={mini}: larger than data.train_batch_size={train}, which verl refuses; "
            f"set {actor}.ppo_mini_batch_size={train}"
        )
    n = int(_get(cfg, f"{_ROLLOUT}.n", 1))
    gpus = int(_get(cfg, "trainer.nnodes", 1)) * int(_get(cfg, "trainer.n_gpus_per_node", 1))
    if gpus >= 1 and (train * n) % gpus:
        step = gpus // math.gcd(gpus, n)
        yield (
            f"data.train_batch_size={train}: times {_ROLLOUT}.n={n} it must split evenly over the {gpus} GPUs; "
            f"set data.train_batch_size={-(-train // step) * step}"
        )


def _temperatures(cfg: Any) -> Iterator[str]:
    if OmegaConf.select(cfg, "agl.train_temperature", default="__absent__") == "__absent__":
        return
    proxy = _get(cfg, "agl.train_temperature")
    engine = _get(cfg, f"{_ROLLOUT}.temperature")
    if not isinstance(proxy, int | float) or isinstance(proxy, bool) or proxy <= 0:
        yield (
            f"agl.train_temperature={_fmt(proxy)}: the proxies must force one sampling temperature > 0 on train calls "
            f"(AGL_PROXY_TRAIN_TEMPERATURE) so the log-probs can be recomputed at it; set agl.train_temperature=1.0"
        )
    elif engine is None or float(engine) != float(proxy):
        yield (
            f"{_ROLLOUT}.temperature={_fmt(engine)}: differs from agl.train_temperature={proxy} (what the proxies "
            f"force), so the PPO ratio would be biased; set {_ROLLOUT}.temperature={proxy}"
        )


def _absolute(cfg: Any, key: str, root: str) -> Iterator[str]:
    value = _get(cfg, key)
    if value is None:
        return
    path = str(value)
    if not PurePosixPath(path).is_absolute():
        suggestion = PurePosixPath(root) / path.removeprefix("~/").removeprefix("./")
        yield (
            f"{key}={path}: relative, so under `ray job submit` it lands in the job's throw-away copy of the "
            f"working directory (a resubmitted run starts over); set {key}={suggestion}"
        )


def _output_paths(cfg: Any) -> Iterator[str]:
    root = str(_get(cfg, "agl.output_dir", "/var/tmp/agl-trainer"))
    if not PurePosixPath(root).is_absolute():
        root = "/var/tmp/agl-trainer"
    yield from _absolute(cfg, "agl.output_dir", root)
    yield from _absolute(cfg, "trainer.default_local_dir", root)
    yield from _absolute(cfg, "agl.state_dir", root)


def _data_files(cfg: Any) -> Iterator[str]:
    train = _files(_get(cfg, "data.train_files"))
    if not train:
        yield "data.train_files=null: the trainer needs its tasks (JSONL, parquet); set data.train_files=<tasks.jsonl>"
    for key, value in (("data.train_files", train), ("data.val_files", _files(_get(cfg, "data.val_files")))):
        for name in value:
            if name.startswith(VERL_DEFAULT_DATA_DIR) or "/data/rlhf/gsm8k/" in name:
                if key == "data.val_files":
                    yield f"{key}={name}: verl's gsm8k default, not agent tasks (null: no validation); set {key}=null"
                else:
                    yield f"{key}={name}: verl's gsm8k default, not agent tasks; set {key}=<tasks.jsonl>"


def _engine_serves_the_routed_name(cfg: Any) -> Iterator[str]:
    name = _get(cfg, f"{_ROLLOUT}.name")
    if str(name) not in SUPPORTED_ENGINES or _external_engines(cfg):
        return
    model = str(_get(cfg, "agl.model_name", ""))
    key = f"{_ROLLOUT}.engine_kwargs.{name}.served_model_name"
    served = _get(cfg, key)
    if served is None or str(served) != model:
        yield (
            f"{key}={_fmt(served)}: the proxies ask the engine for agl.model_name={model} and would get 404; "
            f"set {key}={model}"
        )
    if bool(_get(cfg, f"{_ROLLOUT}.prometheus.enable", False)):
        prom_key = f"{_ROLLOUT}.prometheus.served_model_name"
        prom = str(_get(cfg, prom_key, ""))
        if prom.split("/")[-1] != model:
            yield f"{prom_key}={prom}: with prometheus on verl serves the model under this name; set {prom_key}={model}"
    if name == "vllm":
        auto = bool(_get(cfg, f"{_ROLLOUT}.engine_kwargs.vllm.enable_auto_tool_choice", False))
        parser_key = f"{_ROLLOUT}.engine_kwargs.vllm.tool_call_parser"
        if auto and _get(cfg, parser_key) is None:
            yield f"{parser_key}=null: vLLM refuses enable_auto_tool_choice without a parser; set {parser_key}=hermes"


def _step_compatibility(cfg: Any) -> Iterator[str]:
    if _get(cfg, "critic.enable") is True:
        yield (
            "critic.enable=true: AGL's step computes advantages per rollout and never trains a critic; "
            "set critic.enable=false"
        )
    if bool(_get(cfg, "algorithm.rollout_correction.bypass_mode", False)):
        yield (
            "algorithm.rollout_correction.bypass_mode=true: verl's bypass mode swaps the policy loss for its own "
            "(dropping per_rollout_mean; the IS weights of algorithm.rollout_correction.rollout_is apply without "
            "it); set algorithm.rollout_correction.bypass_mode=false"
        )


CHECKS: tuple[Callable[[Any], Iterator[str]], ...] = (
    _rollout_name,
    _gpus_vs_parallelism,
    _batch_sizes,
    _temperatures,
    _output_paths,
    _data_files,
    _engine_serves_the_routed_name,
    _step_compatibility,
)


def problems(cfg: Any) -> list[str]:
    """Every problem found, one line each, in the order of CHECKS."""
    return [line for check in CHECKS for line in check(cfg)]


def check_config(cfg: Any) -> None:
    """Raises ConfigError naming the first problem (one line: key, value, why, what to set)."""
    found = problems(cfg)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ConfigError(found[0] + more)
