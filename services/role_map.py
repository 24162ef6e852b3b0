"""A run's role map: which model names an agent sends go to which policy, and what a name no entry matches gets.

Pure and shared: `agl train` parses its --role / --frozen-role / --unmapped-models options with it, the trainer builds
the map from its Hydra config (agl.roles) and writes it onto every rollout as the label `agl_roles`, and the proxy
reads that label to route each call by the `model` its request names. The agent changes nothing.

Guarantee: a map that reaches a rollout was checked here, and a label that does not parse is refused whole (the
proxy answers every call of that rollout with the problem), never half applied. Bounded: at most MAX_ROLES entries,
names and patterns of printable characters without spaces, the label at most MAX_LABEL_CHARS.

Resolution: an entry whose pattern has no wildcard matches that exact name, and exact names are looked at first;
then the patterns (`*` any run of characters, `?` one character) in the order given; the first that matches wins.
The policy `policy` (POLICY) is the rollout's own model (its `agl_model` label, else the proxy's own): those calls
train. Any other policy is a model registered in the ledger (another run's adapter, a frozen judge): its calls are
recorded and never in this run's batch. A frozen entry's calls are never trained by any run: served by the model it
names, or by the rollout's own policy as it stands (`policy`: a harness's side calls, answered and left out).
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass

# The rollout label that carries the map (services/trainer/rollouts/specs.py writes it, the proxy reads it).
LABEL_ROLES = "agl_roles"
# The policy name that means the rollout's own model.
POLICY = "policy"
# What a name no entry matches gets: the rollout's own policy (as without a map), or a refusal naming the map.
UNMAPPED_POLICY = "policy"
UNMAPPED_REFUSE = "refuse"
UNMAPPED_CHOICES = (UNMAPPED_POLICY, UNMAPPED_REFUSE)

MAX_ROLES = 32
MAX_PATTERN_CHARS = 200
MAX_POLICY_CHARS = 256
MAX_LABEL_CHARS = 16_000

# Model names as agents send them: claude-haiku-4-5-20251001, gpt-4o-mini, Qwen/Qwen2.5-0.5B, openai:gpt@v2.
_NAME = re.compile(r"^[A-Za-z0-9_.:/@+-]+$")
_PATTERN = re.compile(r"^[A-Za-z0-9_.:/@+*?-]+$")


class RoleMapError(ValueError):
    """A role map (or one entry, or its label) that cannot be used; the message names the problem."""


class UnmappedModel(LookupError):
    """A call names a model no entry of a refusing map matches; the message names the map."""


@dataclass(frozen=True)
class Role:
    """One entry: the model names it matches, the policy they go to, and whether that policy is frozen."""

    pattern: str
    policy: str
    frozen: bool = False

    @property
    def exact(self) -> bool:
        return not any(c in self.pattern for c in "*?")

    def matches(self, requested: str) -> bool:
        return requested == self.pattern if self.exact else fnmatch.fnmatchcase(requested, self.pattern)

    def __str__(self) -> str:
        return f"{self.pattern}={self.policy}{' (frozen)' if self.frozen else ''}"


@dataclass(frozen=True)
class RoleMap:
    roles: tuple[Role, ...] = ()
    unmapped: str = UNMAPPED_POLICY

    def __post_init__(self) -> None:
        check(self)

    @property
    def empty(self) -> bool:
        """No entry and unmapped names to the policy: today's routing, nothing to carry."""
        return not self.roles and self.unmapped == UNMAPPED_POLICY

    def trains(self, own: str = "") -> bool:
        """Whether some call can reach the rollout's own policy to train (`own`: its model's name, if known)."""
        return self.unmapped == UNMAPPED_POLICY or any(not r.frozen and r.policy in (POLICY, own) for r in self.roles)

    def resolve(self, requested: str) -> Role | None:
        """The entry `requested` goes by (None: unmapped, to the rollout's own policy); UnmappedModel when refused."""
        found = next((r for r in self.roles if r.exact and r.matches(requested)), None)
        found = found or next((r for r in self.roles if not r.exact and r.matches(requested)), None)
        if found is None and self.unmapped == UNMAPPED_REFUSE:
            listed = ", ".join(str(r) for r in self.roles) or "no entries"
            raise UnmappedModel(
                f"The model {requested!r} matches no role of this run's role map ({listed}; unmapped models are "
                "refused): send one of these model names, or map this one (agl train --role / --frozen-role)."
                if requested
                else f"The request names no model, and this run's role map ({listed}) refuses unmapped models."
            )
        return found

    def to_label(self) -> str:
        """The label value that carries the map (compact JSON)."""
        entries = [
            {"match": r.pattern, "policy": r.policy, **({"frozen": True} if r.frozen else {})} for r in self.roles
        ]
        text = json.dumps({"roles": entries, "unmapped": self.unmapped}, separators=(",", ":"))
        if len(text) > MAX_LABEL_CHARS:
            raise RoleMapError(f"the role map takes {len(text)} characters as a label; at most {MAX_LABEL_CHARS}")
        return text


def check(roles: RoleMap) -> None:
    """RoleMapError naming the first problem of a map."""
    if roles.unmapped not in UNMAPPED_CHOICES:
        raise RoleMapError(f"unmapped models: {roles.unmapped!r} is not one of {', '.join(UNMAPPED_CHOICES)}")
    if len(roles.roles) > MAX_ROLES:
        raise RoleMapError(f"{len(roles.roles)} roles; a role map holds at most {MAX_ROLES}")
    seen: set[str] = set()
    for role in roles.roles:
        if not role.pattern or len(role.pattern) > MAX_PATTERN_CHARS or not _PATTERN.match(role.pattern):
            raise RoleMapError(
                f"role {role.pattern!r}: a model name or pattern is 1 to {MAX_PATTERN_CHARS} characters of letters, "
                "digits and _.:/@+- with * and ? as wildcards"
            )
        if not role.policy or len(role.policy) > MAX_POLICY_CHARS or not _NAME.match(role.policy):
            raise RoleMapError(
                f"role {role.pattern}: policy {role.policy!r} is not a model name (1 to {MAX_POLICY_CHARS} characters "
                f"of letters, digits and _.:/@+-; {POLICY!r} is the run's own)"
            )
        if role.pattern in seen:
            raise RoleMapError(f"role {role.pattern}: given twice")
        seen.add(role.pattern)


def parse_role(text: str, *, frozen: bool = False) -> Role:
    """One `NAME_PATTERN=POLICY` entry (RoleMapError naming what is wrong)."""
    pattern, sep, policy = text.partition("=")
    if not sep:
        raise RoleMapError(f"{text!r} is not NAME_PATTERN={'MODEL' if frozen else 'POLICY'}")
    role = Role(pattern.strip(), policy.strip(), frozen)
    check(RoleMap((role,)))
    return role


def from_settings(roles: list[str], frozen: list[str], unmapped: str = UNMAPPED_POLICY) -> RoleMap:
    """The map of `--role`/`agl.roles.map` entries, then `--frozen-role`/`agl.roles.frozen` ones (RoleMapError)."""
    return RoleMap(
        (*(parse_role(r) for r in roles), *(parse_role(r, frozen=True) for r in frozen)), str(unmapped).strip()
    )


def from_label(text: str) -> RoleMap:
    """The map a rollout's `agl_roles` label carries (RoleMapError naming the problem)."""
    if len(text) > MAX_LABEL_CHARS:
        raise RoleMapError(f"the {LABEL_ROLES} label is {len(text)} characters; at most {MAX_LABEL_CHARS}")
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise RoleMapError(f"the {LABEL_ROLES} label is not JSON: {err}") from None
    if not isinstance(doc, dict) or set(doc) - {"roles", "unmapped"} or not isinstance(doc.get("roles", []), list):
        raise RoleMapError(f'the {LABEL_ROLES} label is {{"roles": [...], "unmapped": "policy" or "refuse"}}')
    entries = []
    for i, entry in enumerate(doc.get("roles", [])):
        if (
            not isinstance(entry, dict)
            or set(entry) - {"match", "policy", "frozen"}
            or not isinstance(entry.get("match"), str)
            or not isinstance(entry.get("policy"), str)
            or not isinstance(entry.get("frozen", False), bool)
        ):
            raise RoleMapError(f'the {LABEL_ROLES} label\'s roles[{i}] is not {{"match", "policy", "frozen"}}')
        entries.append(Role(entry["match"], entry["policy"], entry.get("frozen", False)))
    unmapped = doc.get("unmapped", UNMAPPED_POLICY)
    if not isinstance(unmapped, str):
        raise RoleMapError(f"the {LABEL_ROLES} label's unmapped is not a string")
    return RoleMap(tuple(entries), unmapped)
