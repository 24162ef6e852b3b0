"""Example agents written the way Agent Lightning v1.0 agents are (see examples/README.md)."""
