"""The reward judge: a model that scores each GRPO group's answers against a user's rubric, for agents that post no
reward. `scoring` is the pure core (the prompt of one group, the reply read as one score per answer, the cache key),
`cache` the scores already given, `endpoint` the one HTTP call (OpenAI chat completions), `group_judge` a group from
finished rollouts to reward events. Nothing here imports grpc or verl; `group_judge` talks to the ledger only
through services.client."""
