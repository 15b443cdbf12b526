"""Fault-injection reliability suite for celery-fencing (not part of the installed package).

A *world* runs real ``celery worker`` processes for two twin workloads at once,
on the same faults: the **fenced** side (FencedTask, SQLGate, RedisGate,
``fenced+redis://``) and the **control** side (the same read-modify-write with
plain writes and no claims). Nemeses (pauses, kills, ZooKeeper failovers and
partitions, Redis and PostgreSQL restarts, clock jumps) hit both sides; every
attempt is written to a JSONL history; the checker (:mod:`reliability.checker`)
reads the histories and the final state of PostgreSQL and Redis and prints the
figures. See docs/reliability.md.

Modules:

=====================  ==========================================================
``workload``           the Celery app the workers run (``celery -A reliability.workload``)
``schema``             table and key names shared by the workload and the harness
``history``            the JSONL history: writing (workers) and reading (harness)
``checker``            the O(n log n) checker and its figures
``collect``            reads histories and final state into the checker's input
``proxy``              an asyncio TCP proxy: pass, blackhole, reset and delay modes
``services``           throwaway Redis and PostgreSQL servers, worker processes
``nemeses``            the faults, each bounded in count and time
``world``              the world: services, workers, proxies; runs phases
``scenarios``          the CI profile: one short phase per fault kind
``soak``               ``python -m reliability.soak --duration S --seed N``
=====================  ==========================================================
"""
