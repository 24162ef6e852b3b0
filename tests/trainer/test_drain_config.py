"""Proxy pause/drain through the ledger, the Hydra config (ours over verl's) and the task datasets."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from services.client import LedgerClient
from services.trainer.config import CONFIG_DIR, CONFIG_NAME, ConfigError, settings_from_config
from services.trainer.rollouts.datasets import TaskLoader, load_samples
from services.trainer.run.drain import ProxyDrainer
from tests.support.procs import start_ledger

pytestmark = pytest.mark.trainer


async def test_drain_waits_for_every_replica_to_apply_the_pause_and_go_idle() -> None:
    with start_ledger() as ledger:
        client = LedgerClient(ledger.address)
        await client.report_proxy_replica("p1", in_flight=2, observed_generation=0)
        await client.report_proxy_replica("p2", in_flight=0, observed_generation=0)
        drainer = ProxyDrainer(client, retry_after_seconds=3, timeout_s=30)
        task = asyncio.create_task(drainer.pause_and_drain("test"))
        while not (await client.get_proxy_control()).paused:
            await asyncio.sleep(0.01)
        generation = (await client.get_proxy_control()).generation
        await client.report_proxy_replica("p1", in_flight=1, observed_generation=generation)
        await client.report_proxy_replica("p2", in_flight=0, observed_generation=generation)
        await asyncio.sleep(0.2)
        assert not task.done()  # p1 still has a call in flight
        await client.report_proxy_replica("p1", in_flight=0, observed_generation=generation)
        result = await asyncio.wait_for(task, 20)
        assert result.drained and result.replicas == 2 and result.seconds >= 0
        control = await client.get_proxy_control()
        assert control.paused and control.retry_after_seconds == 3
        await drainer.resume()
        assert not (await client.get_proxy_control()).paused
        await client.close()


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=list(overrides))


def test_hydra_config_composes_ours_over_verls_without_a_gpu(tmp_path: Path) -> None:
    template = tmp_path / "job.yaml.j2"
    template.write_text("apiVersion: batch/v1\nkind: Job\n")
    cfg = _compose(
        "agl.run_id=exp1",
        "agl.key=secret-key",
        f"agl.launch.k8s_job_template_file={template}",
        "agl.aggregation.level=transition",
        "agl.async_training.enable=true",
        "agl.async_training.async_train_batch_size=16",
        "agl.max_ppo_update_times=2",
        "data.train_batch_size=8",
        "data.max_prompt_length=2048",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "trainer.n_gpus_per_node=1",
    )
    # verl's own tree is there, with our overrides on top.
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "per_rollout_mean"
    assert cfg.actor_rollout_ref.model.external_lib == "services.trainer.data.loss"
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.actor_rollout_ref.actor.clip_ratio == 0.2  # untouched verl default
    assert cfg.trainer.experiment_name == "exp1"
    s = settings_from_config(cfg)
    assert s.key == "secret-key" and "secret-key" not in repr(s)
    assert s.manager.mode == "async" and s.manager.async_train_batch_size == 16 and s.manager.n == 4
    assert s.manager.launch.k8s_job_template.startswith("apiVersion")
    assert s.data_path.level.value == "transition"
    assert s.data_path.max_prompt_length == 2048
    assert s.data_path.max_response_length == cfg.actor_rollout_ref.rollout.response_length
    assert s.data_path.mini_batch_rows == 8 and s.data_path.max_ppo_update_times == 2
    # One data-parallel rank, verl's fixed micro-batches of 8 rows (issue 28 row 4): the rows handed over are a
    # multiple of 8.
    assert s.data_path.row_divisor == 8
    # The run's rollouts name its model (the proxies route by it); its pause holds every call unless scoped.
    assert s.manager.launch.model_name == s.model_name and s.pause_model_name == ""
    scoped = settings_from_config(_compose("agl.launch.agent_class=a:B", "agl.model_name=run-b",
                                           "agl.async_training.pause_scope=model"))  # fmt: skip
    assert scoped.pause_model_name == "run-b" and scoped.manager.launch.model_name == "run-b"


def test_config_rejects_what_cannot_work() -> None:
    with pytest.raises(ConfigError, match="adv_estimator"):
        settings_from_config(_compose("agl.launch.agent_class=a:B", "algorithm.adv_estimator=gae"))
    with pytest.raises(ConfigError, match="agent_class"):
        settings_from_config(_compose())
    with pytest.raises(ConfigError, match="async_train_batch_size"):
        settings_from_config(
            _compose(
                "agl.launch.agent_class=a:B",
                "agl.async_training.enable=true",
                "agl.async_training.async_train_batch_size=2",
                "data.train_batch_size=4",
            )
        )
    with pytest.raises(ValueError, match="run id"):
        settings_from_config(_compose("agl.launch.agent_class=a:B", "agl.run_id='a/b'"))
    with pytest.raises(ConfigError, match=r"pause_scope=run: `all` or `model`"):
        settings_from_config(_compose("agl.launch.agent_class=a:B", "agl.async_training.pause_scope=run"))
    # The staleness bound: a whole number of versions, and only where calls can be older than the update.
    with pytest.raises(ConfigError, match=r"max_staleness=2 bounds asynchronous training"):
        settings_from_config(_compose("agl.launch.agent_class=a:B", "agl.async_training.max_staleness=2"))
    for bad in ("-1", "1.5", "true"):
        with pytest.raises(ConfigError, match="null or a whole number of versions"):
            settings_from_config(_compose("agl.launch.agent_class=a:B", "agl.async_training.enable=true",
                                          f"agl.async_training.max_staleness={bad}"))  # fmt: skip
    bounded = settings_from_config(_compose("agl.launch.agent_class=a:B", "agl.async_training.enable=true",
                                            "agl.async_training.max_staleness=0"))  # fmt: skip
    assert bounded.data_path.max_staleness == 0
    assert settings_from_config(_compose("agl.launch.agent_class=a:B")).data_path.max_staleness is None
    # The mid-step engine check: a number of seconds, and only where there are external engines to check.
    with pytest.raises(ConfigError, match=r"agl\.engines\.check_seconds=-1"):
        settings_from_config(_compose("agl.launch.agent_class=a:B", "agl.engines.check_seconds=-1"))
    with pytest.raises(ConfigError, match="external engines only"):
        settings_from_config(_compose("agl.launch.agent_class=a:B", "agl.engines.check_seconds=5"))
    # The engines' key: for external engines only (verl's replicas take none), unless it is the environment's, which
    # the proxies share.
    with pytest.raises(ConfigError, match=r"agl\.engines\.api_key applies to external engines only"):
        settings_from_config(_compose("agl.launch.agent_class=a:B", "agl.engines.api_key=k1"))
    # LoRA: an adapter only external engines are given; verl's replicas would serve the agents the base model.
    with pytest.raises(ConfigError, match=r"lora\.merge=true"):
        settings_from_config(_compose("agl.launch.agent_class=a:B", "actor_rollout_ref.model.lora_rank=8"))
    # The best validation's weights: an absolute folder, and only with a periodic validation to pick them by.
    with pytest.raises(ConfigError, match=r"agl\.best_dir='best': set an absolute folder"):
        settings_from_config(_compose("agl.launch.agent_class=a:B", "agl.best_dir=best"))
    with pytest.raises(ConfigError, match=r"set data\.val_files and trainer\.test_freq > 0"):
        settings_from_config(_compose("agl.launch.agent_class=a:B", "agl.best_dir=/tmp/best", "trainer.test_freq=-1"))
    kept = _compose(
        "agl.launch.agent_class=a:B", "agl.best_dir=/tmp/best", "data.val_files=v.jsonl", "trainer.test_freq=5"
    )
    assert settings_from_config(kept).best_dir == "/tmp/best"


def test_datasets_load_jsonl_and_parquet_in_memory(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text(json.dumps({"id": "q1", "question": "1+1"}) + "\n\n" + json.dumps({"question": "2+2"}) + "\n")
    parquet = tmp_path / "val.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "3+3", "answer": 6}]), parquet)
    samples = load_samples([str(jsonl), str(parquet)])
    assert [s.data_id for s in samples] == ["q1", "train.jsonl:1", "val.parquet:0"]
    assert samples[2].input == {"question": "3+3", "answer": 6}

    loader = TaskLoader(samples, batch_size=2, shuffle=True, seed=3)
    assert len(loader) == 1
    stream = loader.stream()
    drawn = [next(stream).data_id for _ in range(4)]
    assert sorted(drawn[:3]) == sorted(s.data_id for s in samples)  # an epoch is a permutation
    resumed = TaskLoader(samples, batch_size=2, shuffle=True, seed=3)
    resumed.load_state_dict(loader.state_dict())
    assert loader.state_dict() == {"drawn": 4}
    assert next(resumed.stream()).data_id == next(stream).data_id


def test_lora_settings_push_the_adapter_to_external_engines_or_merged_weights() -> None:
    base = ("agl.launch.agent_class=a:B", "placement=cpu", "actor_rollout_ref.model.lora_rank=8")
    assert settings_from_config(_compose(*base)).adapter_push
    assert not settings_from_config(_compose(*base, "actor_rollout_ref.model.lora.merge=true")).adapter_push
    assert not settings_from_config(_compose("agl.launch.agent_class=a:B", "placement=cpu")).adapter_push
    merged = (
        "agl.launch.agent_class=a:B",
        "actor_rollout_ref.model.lora_rank=8",
        "actor_rollout_ref.model.lora.merge=true",
    )
    assert not settings_from_config(_compose(*merged)).adapter_push


def test_the_engines_key_comes_from_the_stacks_environment_and_is_never_printed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGL_ENGINE_API_KEY", "engine-secret")
    external = settings_from_config(_compose("agl.launch.agent_class=a:B", "placement=cpu"))
    assert external.engine_api_key == "engine-secret" and "engine-secret" not in repr(external)
    # The same environment for a colocated trainer (one .env for the stack) is not refused, and not used.
    assert settings_from_config(_compose("agl.launch.agent_class=a:B")).engine_api_key == "engine-secret"
    explicit = settings_from_config(_compose("agl.launch.agent_class=a:B", "placement=cpu", "agl.engines.api_key=k2"))
    assert explicit.engine_api_key == "k2"
    monkeypatch.delenv("AGL_ENGINE_API_KEY")
    assert settings_from_config(_compose("agl.launch.agent_class=a:B", "placement=cpu")).engine_api_key is None
