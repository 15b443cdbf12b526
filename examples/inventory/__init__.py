"""An inventory counter on Redis: ``python -m examples.inventory`` (see tasks.py)."""
