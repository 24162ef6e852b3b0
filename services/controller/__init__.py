"""The controller: turns queued rollouts into running agents (local subprocesses or Kubernetes Jobs).

Three layers, imports only going downwards (tests/controller/test_layers.py holds them to it):
- here, `__main__` and `config`: the program's wiring and its settings, the only modules that know every runner;
- `local` and `k8s`: the two runners, each built on `core` and neither on the other;
- `core`: the controller loop, the runner interface, how an attempt ends, and what both runners share.
"""

from __future__ import annotations
