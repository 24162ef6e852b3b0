"""The local runner: agents as processes on the controller's host, forked by warm launchers (one per agent module)
or started fresh, contained by the sandbox, with the environment and CA certificates they are given. Built on
`core`; imports nothing of `k8s`."""

from __future__ import annotations
