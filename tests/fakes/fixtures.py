"""Fake provider fixtures (owned by the engine work)."""
