"""What the pytest-celery example (examples/testing/test_pytest_celery.py) runs inside its worker containers."""
