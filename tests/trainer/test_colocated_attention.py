"""The colocated (GPU) placement's actor loads its model without flash_attn, and the attention it gets computes
verl's packed rows (use_remove_padding) exactly.

verl's HFModelConfig asks transformers for `flash_attention_2` unless `override_config.attn_implementation` says
otherwise, and transformers refuses that when the flash_attn package is missing, which nothing installs (it has no
wheel on PyPI for the trainer image's torch). The composed config is turned into verl's own HFModelConfig and the
model is loaded the way verl's FSDP engine loads it (`get_hf_auto_model_class(...).from_pretrained`), on CPU.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.model import get_hf_auto_model_class

from services.trainer.config import CONFIG_DIR, CONFIG_NAME
from tests.support.engine import build_model

pytestmark = pytest.mark.trainer

RUNNABLE = ("agl.launch.agent_class=examples.math_agent.agent:MathAgent", "data.train_files=/srv/tasks.jsonl")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("attention") / "model", hidden=64, layers=2)


def _verl_model_config(model_dir: Path, *overrides: str):
    """verl's HFModelConfig built from the composed config, as its workers build it (`init_model`)."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name=CONFIG_NAME, overrides=[*RUNNABLE, f"actor_rollout_ref.model.path={model_dir}"])
    resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    return resolved, omega_conf_to_dataclass(resolved.actor_rollout_ref.model)


def _load_as_verl(model_config):
    auto_class = get_hf_auto_model_class(hf_config=model_config.hf_config)
    return auto_class.from_pretrained(
        pretrained_model_name_or_path=model_config.local_path, torch_dtype=torch.float32, config=model_config.hf_config
    )


def test_the_colocated_actor_loads_its_model_without_flash_attn(model_dir: Path) -> None:
    # What the trainer image has: no flash_attn (transformers raises ImportError for flash_attention_2 then).
    assert importlib.util.find_spec("flash_attn") is None
    cfg, model_config = _verl_model_config(model_dir)
    assert cfg.agl.engines.external is False  # the colocated placement is the default
    module = _load_as_verl(model_config)
    assert module.config._attn_implementation == "sdpa"


def test_sdpa_keeps_verls_packed_rows_apart(model_dir: Path) -> None:
    """verl's remove-padding path (model.use_remove_padding, on in the colocated placement) packs a micro-batch into
    one row with restarting position ids, no attention mask and no cache (its forward_step passes use_cache=False):
    each sequence must attend only to itself."""
    cfg, model_config = _verl_model_config(model_dir)
    assert cfg.actor_rollout_ref.model.use_remove_padding is True
    module = _load_as_verl(model_config).eval()
    generator = torch.Generator().manual_seed(0)
    lengths = (7, 12, 5)
    vocab = int(module.config.vocab_size)
    sequences = [torch.randint(3, vocab - 1, (n,), generator=generator) for n in lengths]
    with torch.no_grad():
        alone = [
            module(input_ids=s[None], position_ids=torch.arange(len(s))[None], use_cache=False).logits[0]
            for s in sequences
        ]
        packed = module(
            input_ids=torch.cat(sequences)[None],
            attention_mask=None,
            position_ids=torch.cat([torch.arange(n) for n in lengths])[None],
            use_cache=False,
        ).logits[0]
    assert torch.allclose(packed, torch.cat(alone), atol=1e-5), float((packed - torch.cat(alone)).abs().max())
