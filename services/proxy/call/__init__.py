"""One model call, end to end (`pipeline`): the request checked and rewritten for its mode, forwarded, its
tokens and log-probs captured from the answer or the stream, recorded as a `model_request` event; token continuation
keeps a multi-turn rollout on the tokens its model sampled."""
