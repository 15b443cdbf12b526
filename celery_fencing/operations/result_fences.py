"""Read-only view of the fenced result backend's fence hashes, for ``celery-fencing inspect``.

The ``fenced+redis://`` backend keeps, beside each result, a hash
``celery-task-fence-<task id>`` with the result's mark, its grantor and the
execution that sealed the task (see :mod:`celery_fencing.gates.redis_scripts`).
A task fenced on its task id has its task id as resource, so ``inspect`` can
show the result's mark beside the gates' marks, and who sealed it. Nothing is
written.
"""

from __future__ import annotations

from typing import Any

from ..exceptions import FencingConfigurationError, GateUnavailableError
from ..gates.redis_scripts import RESULT_FLOOR_KEY
from ..token import FencingToken, Mark

__all__ = ["FENCE_KEY_PREFIX", "ResultFences"]

#: The fence hash of task ``<id>`` is ``celery-task-fence-<id>`` (under Celery's global key prefix, if any).
FENCE_KEY_PREFIX = "celery-task-fence-"


class ResultFences:
    """The marks of the fenced result backend at a Redis server, by task id (= the resource of task-id tasks)."""

    def __init__(self, client: Any, *, keyprefix: str = "") -> None:
        self.client = client
        self.prefix = f"{keyprefix}{FENCE_KEY_PREFIX}"
        self.floor_key = f"{keyprefix}{RESULT_FLOOR_KEY}"

    def arm(self, floor: int | FencingToken) -> int:
        """Set the backend store's floor unless it holds a higher one; return the floor in force (``arm``)."""
        from ..gates.redis_floor import encode_floor, raise_floor
        from ..gates.redis_scripts import ARM_SCRIPT

        encode_floor(floor)  # bad input is refused before any I/O
        try:
            return raise_floor(self.client.register_script(ARM_SCRIPT), self.floor_key, floor)
        except Exception as exc:  # redis-py's errors: the server could not be written
            raise GateUnavailableError(f"cannot arm the result backend's store: {exc}", gate="result") from exc

    def _fields(self, task_id: str) -> dict[str, str]:
        try:
            raw = self.client.hgetall(self.prefix + task_id)
        except Exception as exc:  # redis-py's errors: the server could not be read
            raise GateUnavailableError(f"cannot read the result fence of {task_id!r}: {exc}", gate="result") from exc
        return {_text(key): _text(value) for key, value in raw.items()}

    def mark(self, resource: str) -> Mark | None:
        """The result's mark and its grantor, or ``None`` when the task has no fence hash (or it expired)."""
        fields = self._fields(resource)
        mark = fields.get("mark")
        return None if mark is None else Mark(resource, int(mark), fields.get("grantor"))

    def high_water(self, resource: str) -> int | None:
        found = self.mark(resource)
        return None if found is None else found.value

    def applied(self, resource: str, task_id: str) -> str | None:
        """The execution that sealed *task_id* (exactly once), when the resource is that task id."""
        return self._fields(task_id).get("done") if resource == task_id else None

    def claim(self, token: FencingToken | None = None) -> None:
        raise FencingConfigurationError("the result backend's fences are shown read-only here")


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
