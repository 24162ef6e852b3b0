"""The Kubernetes runner: one batch/v1 Job per rollout, rendered from its Jinja2 template in worker processes, paced,
followed by a watch and a re-list, and judged from the Job's and its pods' status. Built on `core`; imports nothing
of `local`."""

from __future__ import annotations
