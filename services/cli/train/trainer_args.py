"""The trainer's command line for a plan (its Hydra overrides), and the check that the trainer takes it.

`agl train` starts the trainer after the services, the supervised start and the smoke rollout: over a minute in. A
setting the trainer refuses (a Hydra override of the user's, or of an example's) is found before all that: the
config is composed here, in process, and put through the trainer's own validation (its settings and its
pre-flight), which then refuses it in the same words at the start of the command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import USAGE, CliError
from . import export, prompt_fit, reporting

# A plan here is plan.py's TrainPlan, which calls check() as its last check: typed Any, as importing plan.py here,
# even for its type alone, would make the two modules one circle.
TrainPlan = Any

TRAJECTORIES_FILE = "trajectories.jsonl"
# Where the stack's ledger will listen is not known before it starts; no check reads it.
_LEDGER_UNKNOWN = "127.0.0.1:1"


def overrides(plan: TrainPlan, ledger: str, model_name: str, model_path: Path) -> list[str]:
    """The trainer's Hydra overrides for the plan, given the stack's ledger and model name: AGL's own first, then
    the example's and the user's, which win."""
    state = plan.output / "state"
    launch = [f"agl.launch.agent_class={plan.agent_class}"] if plan.agent_class else []
    if plan.command:
        launch.append("agl.launch.command=" + json.dumps(list(plan.command)))
    val = [f"data.val_files={plan.val_file}"] if plan.val_file else ["data.val_files=null"]
    args = [
        f"placement={'cpu' if plan.placement == 'cpu' else 'colocated'}",
        f"agl.run_id={plan.run_id}",
        f"agl.ledger_address={ledger}",
        f"agl.model_name={model_name}",
        *launch,
        *(f"+agl.launch.env_map.{name}={json.dumps(value)}" for name, value in plan.env_map.items()),
        f"agl.launch.timeout_seconds={plan.rollout_timeout}",
        f"agl.output_dir={state}",
        f"agl.state_dir={state / 'manager'}",
        f"agl.trajectory_log={plan.output / TRAJECTORIES_FILE}",
        "agl.progress=false",
        f"data.train_files={plan.train_file}",
        *val,
        f"data.train_batch_size={plan.tasks_per_step}",
        f"data.max_prompt_length={plan.max_prompt_length}",
        f"actor_rollout_ref.rollout.n={plan.group_size}",
        f"actor_rollout_ref.rollout.response_length={plan.max_response_length}",
        f"actor_rollout_ref.model.path={model_path}",
        f"actor_rollout_ref.actor.optim.lr={plan.lr}",
        *(lora_overrides(plan) if plan.lora_rank else []),
        *prompt_fit.trainer_overrides(plan.max_prompt_length, plan.max_response_length),
        f"trainer.total_training_steps={plan.steps}",
        f"trainer.test_freq={plan.val_every if plan.val_every > 0 and plan.val_file else -1}",
        f"trainer.val_before_train={'true' if plan.val_file else 'false'}",
        f"trainer.save_freq={plan.save_every}",
        "trainer.resume_mode=auto",
        reporting.trainer_loggers(plan.report_to),
        # Every checkpoint of a real model is its size again (with the optimizer's state, three times it).
        "trainer.max_actor_ckpt_to_keep=2",
        f"trainer.default_local_dir={plan.output / 'checkpoints'}",
        # The best validation's weights are kept beside the last step's; export takes them (export.py).
        *([f"agl.best_dir={plan.output / export.BEST_DIR}"] if keeps_best(plan) else []),
        *(plan.judge.overrides() if plan.judge is not None else []),
        *plan.roles,
    ]
    if plan.placement == "cpu":
        args.append(f"agl.engines.weights_dir={state / 'weights'}")
    else:
        import torch

        args.append(f"trainer.n_gpus_per_node={torch.cuda.device_count()}")
        parser = plan.tool_call_parser
        args.append(f"agl.tool_calls.enable_auto_tool_choice={'false' if parser == 'none' else 'true'}")
        if parser != "none":
            args.append(f"agl.tool_calls.parser={parser}")
        # verl's own engines get the weights in memory: the model to hand back is saved with each checkpoint.
        args.append("actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]")
    # The caller's settings win: the example's, then the user's own Hydra overrides.
    return [*args, *plan.extra_overrides, *plan.overrides]


def keeps_best(plan: TrainPlan) -> bool:
    """Whether the run validates periodically, so the trainer can keep the best validation's weights; a Hydra
    override of the validation's own settings is the user's, and the trainer would refuse agl.best_dir without it."""
    own = {o.split("=", 1)[0].lstrip("+~") for o in [*plan.extra_overrides, *plan.overrides]}
    return plan.val_every > 0 and plan.val_file is not None and not own & {"trainer.test_freq", "data.val_files"}


def lora_overrides(plan: TrainPlan) -> list[str]:
    model = "actor_rollout_ref.model"
    return [f"{model}.lora_rank={plan.lora_rank}", f"{model}.lora_alpha={plan.lora_alpha}"]


def check(plan: TrainPlan, model_name: str) -> None:
    """CliError (exit 2) with the trainer's own line for a config it would refuse at its start."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from services.trainer.config import CONFIG_DIR, ConfigError, settings_from_config
    from services.trainer.preflight import check_config

    model = Path(plan.model)  # the tiny model is built later; no check reads the model's files
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            cfg = compose("agl_trainer", overrides=overrides(plan, _LEDGER_UNKNOWN, model_name, model))
        settings_from_config(cfg)
        check_config(cfg)
    except ConfigError as err:
        raise CliError(f"the trainer would refuse this run: {err}", USAGE) from None
    except (HydraException, OmegaConfBaseException) as err:
        if _cut_short(err):  # Ctrl-C during the compose, which Hydra reports as a composition error
            raise KeyboardInterrupt from None
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CliError(f"the trainer's config does not take these overrides: {first}", USAGE) from None


def _cut_short(error: BaseException) -> bool:
    """Whether a KeyboardInterrupt is among the causes of `error`."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
