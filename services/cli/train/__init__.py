"""`agl train`, `agl eval` and `agl export`: a user's agent trained and scored on this machine, every service
started and stopped by the command itself."""
