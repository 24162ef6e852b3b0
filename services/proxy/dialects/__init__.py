"""The agent APIs served by translating them to the engine's chat completions: Anthropic Messages and OpenAI
Responses (with its tools and `previous_response_id` chain). Pure: no I/O."""
