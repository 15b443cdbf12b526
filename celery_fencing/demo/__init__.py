"""``celery-fencing demo``: the paused-writer race, played live by real ``celery worker`` processes.

The demo starts two workers (W1, W2), and plays one story twice, once without
fencing and once with it::

    W1 starts "deposit 10 to account 42" and reads the balance (100)
    W1 is frozen with SIGSTOP (standing in for a GC pause or a VM freeze)
    W2 runs "deposit 20 to account 42": reads 100, writes 120
    W1 is resumed with SIGCONT and writes 110

Without fencing W1's write destroys W2's deposit. With fencing, W1's token is
below the mark W2's claim left at the storage: the write is refused, the task
is retried with a new token, re-reads 120 and writes 130.

Modules:

* :mod:`.runner` plays the story and prints the timeline (the CLI calls it), and
  cleans up on every path;
* :mod:`.story` is the story's cast and numbers, and what one run of it yields;
* :mod:`.timeline` renders each run's timeline and verdict, and the conclusion's exit code;
* :mod:`.options` holds the command-line options and the settings they choose;
* :mod:`.world` records what an invocation creates, checks the servers, and undoes it;
* :mod:`.progress` is the status line on stderr;
* :mod:`.processes` starts, freezes, thaws and stops the ``celery worker`` processes;
* :mod:`.app` is the Celery app the workers run (``celery -A celery_fencing.demo.app``),
  built by :mod:`.tasks` from the ``CELERY_FENCING_DEMO_*`` environment
  variables (:mod:`.settings`);
* :mod:`.store` holds the account in SQLite, PostgreSQL or Redis, behind a gate;
* :mod:`.events` is the append-only log through which workers report progress.

Nothing here is imported by ``import celery_fencing``.
"""

from __future__ import annotations

__all__: list[str] = []
