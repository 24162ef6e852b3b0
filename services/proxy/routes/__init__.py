"""The HTTP routes (Starlette) over the pure parts: the agent's model-call and event routes, the operator's
admin routes, liveness and readiness, with each agent API's error shape and the agents' side limits."""
