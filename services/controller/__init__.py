"""The controller: turns queued rollouts into running agents (local subprocesses or Kubernetes Jobs)."""

from __future__ import annotations
