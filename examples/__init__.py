"""Runnable examples; each is started from the repository root with ``python -m examples.<name>``."""
