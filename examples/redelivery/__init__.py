"""A long job re-delivered by the Redis visibility timeout: ``python -m examples.redelivery`` (see tasks.py)."""
