"""A minimal Django project whose Celery tasks are fenced by DjangoGate: ``python -m examples.django``."""
