"""Benchmarks of celery-fencing: each comparison measured A/B, alternating in rounds, in one run.

Run them all with ``python -m benchmarks`` (see ``--help``); each module also
runs alone (``python -m benchmarks.minting``, ``python benchmarks/mint.py``).
They start their own throwaway ZooKeeper servers and use the machine's Redis
(and, for ``gates``, PostgreSQL and MariaDB) under private key prefixes and
queues. No benchmark is a timed test: tests/benchmarks runs each one quickly
so they cannot rot, and asserts nothing about speed.
"""
