"""``celery-fencing doctor -A proj``: check a Celery app's fencing setup, and say how to fix it.

What is checked, in order:

* **app**: ``install(app)`` was called; the ``fencing_*`` settings are valid;
  fenced tasks are registered (after importing ``imports``/``include``).
* **source**: configured, reachable, and monotonic: two tokens are minted on the
  doctor's own resource (``celery-fencing:doctor``) and the second must be larger.
* **zookeeper**, **etcd**: ensemble size from the URL; ZooKeeper's session
  timeout against ``fencing_timeout`` and its negotiation bounds; etcd's
  ``lease_ttl`` against ``fencing_timeout`` in exclusive mode.
* **gates**: every gate of every fenced task answers (a mark read on the
  doctor's resource, nothing written); a Redis gate's persistence (``CONFIG GET
  appendonly``/``save``): a store without persistence forgets marks on restart.
* **results**: the result backend, and the persistence of a ``fenced+redis://`` one.
* **broker** and **timing**: the broker answers; settings that make the broker
  re-deliver a task while it still runs: ``visibility_timeout`` (Redis, SQS)
  against task time limits for ``acks_late`` tasks, and against the longest
  retry delay (a message waiting for its ETA or countdown stays unacknowledged);
  RabbitMQ's ``consumer_timeout``.

Every finding carries a concrete fix. Statuses: ``ok``; ``note`` (advice, does
not fail); ``warning`` and ``error`` (both make the exit code 1).

One area of checks per module, each a part of :class:`Doctor`:

* :mod:`.checkup`: :class:`Doctor`, which runs them in order;
* :mod:`.app_checks`: ``install(app)``, the settings, the fenced tasks;
* :mod:`.source_checks`: the token source, and its ensemble (ZooKeeper, etcd);
* :mod:`.storage_checks`: the gates, the result backend, Redis persistence;
* :mod:`.timing_checks`: the broker, and re-delivery while a task runs;
* :mod:`.report`: :class:`Check`, the findings, and the base the areas share;
* :mod:`.loading`: :func:`load_app`, the app the way ``celery -A`` finds it;
* :mod:`.config_values`: reading seconds and URL schemes from the app's configuration.
"""

from __future__ import annotations

from .checkup import Doctor
from .loading import load_app
from .report import DOCTOR_RESOURCE, Check

# Module attributes before the module became a package, still importable from here.
from .report import Status as Status
from .source_checks import ZOOKEEPER_MIN_SESSION as ZOOKEEPER_MIN_SESSION
from .storage_checks import describe_gate as describe_gate
from .timing_checks import RABBITMQ_CONSUMER_TIMEOUT as RABBITMQ_CONSUMER_TIMEOUT
from .timing_checks import VISIBILITY_DEFAULTS as VISIBILITY_DEFAULTS

__all__ = ["DOCTOR_RESOURCE", "Check", "Doctor", "load_app"]
