"""`agl train`'s role options (--role, --frozen-role, --unmapped-models): checked in one line each, and handed to the
trainer as its agl.roles settings (services/role_map.py says what a map means; docs: training/roles)."""

from __future__ import annotations

import argparse
import json

from services import role_map

from ..errors import USAGE, CliError


def add_role_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("roles: the model names your agent sends (docs: training/roles)")
    group.add_argument(
        "--role",
        action="append",
        default=None,
        metavar="NAME_PATTERN=policy",
        help="calls naming this model (exact, or a pattern with * and ?) go to the run's policy and train; repeat it",
    )
    group.add_argument(
        "--frozen-role",
        action="append",
        default=None,
        metavar="NAME_PATTERN=policy",
        help="calls naming this model are answered by the run's policy as it stands, recorded and never trained (a "
        "harness's side calls, e.g. 'claude-haiku-*=policy'); repeat it",
    )
    group.add_argument(
        "--unmapped-models",
        choices=role_map.UNMAPPED_CHOICES,
        default=None,
        help="what a model name no role matches gets: policy (the run's policy: the default, as without roles) or "
        "refuse (404 naming the roles)",
    )


def role_overrides(args: argparse.Namespace) -> list[str]:
    """The trainer's agl.roles.* settings for the role options (none given: none); CliError, one line."""
    roles, frozen = list(args.role or []), list(args.frozen_role or [])
    unmapped = str(args.unmapped_models or role_map.UNMAPPED_POLICY)
    try:
        parsed = role_map.from_settings(roles, frozen, unmapped)
    except role_map.RoleMapError as err:
        raise CliError(f"--role / --frozen-role: {err}", USAGE) from None
    for role in parsed.roles:
        if role.policy != role_map.POLICY:
            option = "--frozen-role" if role.frozen else "--role"
            raise CliError(
                f"{option} {role.pattern}={role.policy}: agl train serves one model, the run's policy: name it "
                f"`policy` (another registered model needs your own stack and the trainer's agl.roles settings)",
                USAGE,
            )
    if not parsed.trains():
        raise CliError(
            "--unmapped-models refuse needs a --role NAME_PATTERN=policy: otherwise no call reaches the run's policy "
            "and nothing trains",
            USAGE,
        )
    if not roles and not frozen:
        return [f"agl.roles.unmapped={unmapped}"] if args.unmapped_models else []
    return [
        f"agl.roles.map=[{','.join(json.dumps(r) for r in roles)}]",
        f"agl.roles.frozen=[{','.join(json.dumps(r) for r in frozen)}]",
        f"agl.roles.unmapped={unmapped}",
    ]
