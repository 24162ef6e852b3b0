"""Rollout hooks as a v1.0 user writes them (agentlightning.hooks.RolloutHooks): a label on every enqueued rollout,
and a note written back when one succeeds (which AGL refuses: a finished rollout's events are final)."""

from __future__ import annotations

from typing import Any

from agentlightning.hooks import RolloutHooks


class NoteHooks(RolloutHooks):
    def on_enqueue(self, request: Any) -> Any:
        metadata = dict(request.metadata or {}) if isinstance(request.metadata, dict) else {}
        return request.model_copy(update={"metadata": {**metadata, "labelled_by": "on_enqueue"}})

    def on_succeeded(self, rollout: Any, events: dict[str, list[Any]], store: Any) -> None:
        attempt_id = next(iter(events))
        store.add_event(rollout.rollout_id, attempt_id, "hook_note", {"calls": len(events[attempt_id])})
