"""Helpers that start the real services as subprocesses on loopback for tests."""
