"""Helpers for the RabbitMQ tests (which live in tests/celery/test_rabbitmq_*.py, beside the worker harness)."""
