"""The fenced worker container: the user's tasks, celery-fencing installed and ``install(app)`` applied.

A :class:`FencedWorkerContainer` is pytest-celery's worker container with the
celery-fencing image and app template (worker_app.py). Its ``/app`` is written
into the container before it starts (no volume, no helper image), it joins both
lab networks, and it runs a prefork pool of one process, so a frozen task body
still leaves the worker's broker connection to the pool's parent.

Given the test's :class:`~celery_fencing.testing.PausePoints` and
:class:`~celery_fencing.testing.events.FencingEvents`, the workers share them:
their directories are bind-mounted at the same paths and named in the
workers' environment, so ``pause_point`` in a task body holds the execution in
the container and the library's signals there are recorded into the test's
events file. Pids in arrivals and events are the containers' own (two
containers may both have a pid 8): tell executions apart by their tokens.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from pytest_celery.vendors.worker.container import CeleryWorkerContainer  # type: ignore[import-untyped]

from ..processes import wait_for
from .defaults import READY_TIMEOUT, WORKER_IMAGE
from .lab import ContainerLab

if TYPE_CHECKING:
    from ..events import FencingEvents
    from ..pause import PausePoints


class FencedWorkerContainer(CeleryWorkerContainer):  # type: ignore[misc]
    """pytest-celery's worker container running celery-fencing's image and app template."""

    @classmethod
    def image(cls) -> str:
        return WORKER_IMAGE

    @classmethod
    def app_module(cls) -> ModuleType:
        from . import worker_app

        return worker_app

    @classmethod
    def command(
        cls, *args: str, debugpy: bool = False, wait_for_client: bool = True, **kwargs: dict[str, Any]
    ) -> list[str]:
        return [
            "celery", "-A", "app", "worker", f"--loglevel={cls.log_level()}", "-n", f"{cls.worker_name()}@%h",
            "-Q", cls.worker_queue(), "--pool=prefork", "--concurrency=1", "--without-mingle", "--without-gossip",
            *args,
        ]  # fmt: skip

    def ready_now(self) -> bool:
        """True once the worker logged Celery's ``ready.`` (False if it died first: see :meth:`logs`)."""
        self.reload()
        if self.status == "exited":
            raise RuntimeError(f"worker container {self.name} exited:\n{self.logs()[-3000:]}")
        return "ready." in self.logs()


def start_workers(
    lab: ContainerLab,
    *,
    roles: list[str],
    files: dict[str, bytes],
    environment: dict[str, str],
    image: str = WORKER_IMAGE,
    args: tuple[str, ...] = (),
    pause_points: PausePoints | None = None,
    events: FencingEvents | None = None,
) -> list[FencedWorkerContainer]:
    """Start one fenced worker per role on both of *lab*'s networks, with */app* = *files*; wait for all.

    The workers boot side by side. Every URL in *environment* (broker, backend,
    token source, data) is checked to name only the lab's containers first.
    *pause_points* and *events* are shared with the workers (see above).
    """
    for value in environment.values():
        if "://" in value:
            lab.check_url(value)
    environment = dict(environment)
    shared = []
    if pause_points is not None:
        environment.update(pause_points.env)
        shared.append(str(pause_points.directory))
    if events is not None:
        environment.update(events.env)
        shared.append(str(events.path.parent))
    workers = [
        lab.run(
            FencedWorkerContainer,
            role=role,
            image=image,
            command=FencedWorkerContainer.command(*args),
            networks=[lab.data, lab.coordination],
            environment={"PYTHONPATH": "/app", **environment},
            files=files,
            shared=shared,
        )
        for role in roles
    ]
    for worker in workers:
        wait_for(worker.ready_now, READY_TIMEOUT, f"worker {worker.name} to be ready", interval=0.1)
    return workers


def worker_files(tasks: set[ModuleType], app: Any = None) -> dict[str, bytes]:
    """The ``/app`` content for *tasks* (and *app*'s configuration), as pytest-celery generates it."""
    content: dict[str, bytes] = FencedWorkerContainer.initial_content(worker_tasks=tasks, worker_app=app)
    return content
