"""Roles on the trainer's side (issue 44 items 1 and 3): `agl train`'s role options reach the trainer's agl.roles and
from there every rollout's `agl_roles` label; a malformed map is refused where it enters; and a call of another
policy or a frozen role never reaches a row, is counted, and leaves the main conversation's row exact even when it
comes between two of the policy's calls (the events as the ledger's triplet view hands them over)."""

from __future__ import annotations

import argparse
import json
from collections import Counter

import pytest
from hydra import compose, initialize_config_dir

from services import role_map
from services._gen.agl.v1 import event_pb2, rollout_pb2
from services.cli.errors import CliError
from services.cli.train.roles import role_overrides
from services.client import LedgerClient
from services.trainer.config import CONFIG_DIR, CONFIG_NAME, ConfigError, settings_from_config
from services.trainer.data.aggregation import TRAJECTORY_BREAKS, rows_from_trace
from services.trainer.data.triplets import OTHER_ROLE_CALLS, trace_from_events
from services.trainer.rollouts.specs import Sample, build_specs
from tests.support.procs import start_ledger
from tests.trainer import events

pytestmark = pytest.mark.trainer

POLICY = event_pb2.MODEL_REQUEST_ROLE_POLICY
FROZEN = event_pb2.MODEL_REQUEST_ROLE_FROZEN
OTHER = event_pb2.MODEL_REQUEST_ROLE_OTHER_POLICY


def options(role=None, frozen_role=None, unmapped_models=None) -> argparse.Namespace:
    return argparse.Namespace(role=role, frozen_role=frozen_role, unmapped_models=unmapped_models)


def compose_settings(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name=CONFIG_NAME, overrides=["agl.launch.command=[agent]", *overrides])
    return settings_from_config(cfg)


def test_the_role_options_reach_every_rollouts_label_through_the_trainers_config() -> None:
    overrides = role_overrides(options(["claude-sonnet-*=policy"], ["claude-haiku-*=policy"], "refuse"))
    launch = compose_settings(*overrides).manager.launch
    spec = build_specs(run_id="r", step=1, slot=0, sample=Sample("d0", {}), n=1, launch=launch)[0]
    carried = role_map.from_label(spec.metadata.labels[role_map.LABEL_ROLES])
    assert carried == role_map.RoleMap(
        (role_map.Role("claude-sonnet-*", "policy"), role_map.Role("claude-haiku-*", "policy", frozen=True)), "refuse"
    )
    assert carried.resolve("claude-haiku-4-5").frozen and not carried.resolve("claude-sonnet-4-5").frozen
    with pytest.raises(role_map.UnmappedModel, match=r"'gpt-4o' matches no role .*claude-haiku-\*=policy \(frozen\)"):
        carried.resolve("gpt-4o")
    # Exact names before patterns, patterns in their order.
    ordered = role_map.from_settings(["claude-*=policy", "claude-haiku-4-5=judge"], [])
    assert (
        ordered.resolve("claude-haiku-4-5").policy == "judge" and ordered.resolve("claude-haiku-3").policy == "policy"
    )
    # No options: no label, every call to the run's policy as before.
    assert role_overrides(options()) == []
    plain = compose_settings().manager.launch
    spec = build_specs(run_id="r", step=1, slot=0, sample=Sample("d0", {}), n=1, launch=plain)[0]
    assert role_map.LABEL_ROLES not in spec.metadata.labels


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        (options(["claude haiku=policy"]), "role 'claude haiku': a model name or pattern is"),
        (options(["claude-haiku-*"]), "'claude-haiku-*' is not NAME_PATTERN=POLICY"),
        (options(["a*=policy", "a*=policy"]), "role a*: given twice"),
        (options(frozen_role=["claude-haiku-*=judge"]), "agl train serves one model, the run's policy"),
        (options(frozen_role=["claude-haiku-*=policy"], unmapped_models="refuse"), "--unmapped-models refuse needs"),
    ],
)
def test_role_options_that_cannot_work_are_refused_in_one_line(given: argparse.Namespace, problem: str) -> None:
    with pytest.raises(CliError, match=problem.replace("*", r"\*")) as caught:
        role_overrides(given)
    assert "\n" not in str(caught.value)


def test_a_malformed_map_in_the_trainers_config_or_a_label_is_refused_naming_the_problem() -> None:
    with pytest.raises(ConfigError, match=r"agl.roles: role gpt-4o: policy 'no way' is not a model name"):
        compose_settings('agl.roles.map=["gpt-4o=no way"]')
    with pytest.raises(ConfigError, match=r"unmapped=refuse and no agl\.roles\.map entry names `policy`"):
        compose_settings("agl.roles.unmapped=refuse")
    with pytest.raises(ConfigError, match=r"agl\.roles: unmapped models: 'sometimes' is not one of policy, refuse"):
        compose_settings("agl.roles.unmapped=sometimes")
    for label, problem in [
        ("{", "is not JSON"),
        ('{"roles": {"match": "a"}}', 'label is {"roles"'),
        ('{"roles": [{"match": "a", "policy": "b", "frozen": "yes"}]}', "roles[0] is not"),
        ('{"roles": [], "unmapped": "maybe"}', "'maybe' is not one of"),
        (json.dumps({"roles": [{"match": f"a{i}", "policy": "b"} for i in range(40)]}), "at most 32"),
    ]:
        with pytest.raises(role_map.RoleMapError, match=problem.replace("[", r"\[").replace("{", r"\{")):
            role_map.from_label(label)


def call(prompt: list[int], response: list[int], role: int = POLICY) -> event_pb2.Event:
    event = events.call(prompt, response, [-0.5] * len(response))
    event.rollout_id, event.attempt_id = "ro-1", "at-1"
    event.model_request.role = role
    event.model_request.requested_model = "claude-haiku-4-5" if role != POLICY else "claude-sonnet-4-5"
    return event


# The main conversation: turn 1 (prompt 1-4, answer 5-6), a side call of a frozen role in between (its own prompt,
# which shares the main one's beginning), then turn 2 continuing turn 1 with a tool result (7-8) and answering 9.
MAIN_1 = call([1, 2, 3, 4], [5, 6])
SIDE = call([1, 2, 30, 31], [32], FROZEN)
OTHER_SIDE = call([40, 41], [42, 43], OTHER)
MAIN_2 = call([1, 2, 3, 4, 5, 6, 7, 8], [9])
REWARD = events.reward(1.0)
REWARD.rollout_id, REWARD.attempt_id = "ro-1", "at-1"


def rows_of(recorded: list[event_pb2.Event], counts: Counter[str]):
    trace = trace_from_events("ro-1", "g", "d", recorded, reward_fillna_value=0.0, counts=counts)
    return rows_from_trace(trace, "trajectory", max_prompt_length=64, max_response_length=64, counts=counts)


def test_other_roles_calls_never_reach_a_row_and_a_side_call_between_two_turns_keeps_the_main_row_exact() -> None:
    counts: Counter[str] = Counter()
    [row] = rows_of([MAIN_1, SIDE, OTHER_SIDE, MAIN_2, REWARD], counts)
    assert row.prompt_ids == [1, 2, 3, 4]
    assert row.response_ids == [5, 6, 7, 8, 9] and row.response_mask == [1, 1, 0, 0, 1]
    assert row.logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5] and row.num_turns == 2 and row.reward == 1.0
    assert counts[OTHER_ROLE_CALLS] == 2 and counts[TRAJECTORY_BREAKS] == 0
    # Were the side calls the policy's, each would be a row of its own (a break each): what the role keeps out.
    policy_side = [call(list(e.model_request.prompt_token_ids), list(e.model_request.response_token_ids))
                   for e in (SIDE, OTHER_SIDE)]  # fmt: skip
    counts = Counter()
    assert len(rows_of([MAIN_1, *policy_side, MAIN_2, REWARD], counts)) == 3 and counts[TRAJECTORY_BREAKS] == 2


async def test_the_role_survives_the_ledgers_triplet_view() -> None:
    with start_ledger() as ledger:
        async with LedgerClient(ledger.address) as client:
            spec = rollout_pb2.RolloutSpec(rollout_id="ro-1", input_json="{}", is_train=True)
            await client.create_rollouts([spec])
            await client.update_status("ro-1", rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id="at-1")
            await client.append_events([MAIN_1, SIDE, OTHER_SIDE, MAIN_2, REWARD])
            view = await client.list_events("ro-1", view=event_pb2.EVENT_VIEW_TRIPLET)
    assert [e.model_request.role for e in view if e.HasField("model_request")] == [POLICY, FROZEN, OTHER, POLICY]
    assert not any(e.model_request.requested_model for e in view)  # the view keeps the role, not the name
    counts: Counter[str] = Counter()
    [row] = rows_of(view, counts)
    assert row.response_ids == [5, 6, 7, 8, 9] and counts[OTHER_ROLE_CALLS] == 2
