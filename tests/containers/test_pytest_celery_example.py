"""examples/testing/test_pytest_celery.py, the pytest-celery route, passes fenced and fails on the lost update unfenced.

Run as the other two examples are (tests/examples/test_testing_examples.py): its
own pytest process from the repository root, as a user runs it, where pytest-celery
(by its entry point) and celery_fencing.testing (named with ``-p`` as well) are both
loaded and the test uses fixtures of both: pytest-celery's ``celery_setup`` and the
kit's ``fencing_pause_points``, ``fencing_events`` and container fixtures.
"""

from __future__ import annotations

from tests.examples.test_testing_examples import run_example_tests


def test_the_pytest_celery_example_passes_with_fencing_and_fails_on_the_lost_update_without() -> None:
    """Fenced, host A's stale write is refused (115); unfenced, it writes 110 over the 115."""
    fenced = run_example_tests("test_pytest_celery.py", None, fencing=True, plugins=("celery_fencing.testing",))
    assert fenced.returncode == 0, fenced.stdout + fenced.stderr
    assert "1 passed" in fenced.stdout
    unfenced = run_example_tests("test_pytest_celery.py", None, fencing=False, plugins=("celery_fencing.testing",))
    assert unfenced.returncode == 1, unfenced.stdout + unfenced.stderr
    assert "1 failed" in unfenced.stdout
    assert "assert 110 == 115" in unfenced.stdout, unfenced.stdout
