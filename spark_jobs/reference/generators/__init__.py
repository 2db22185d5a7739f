"""Deterministic event generators for the reference jobs: same seed, same events."""
