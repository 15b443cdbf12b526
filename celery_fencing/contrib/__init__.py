"""Integrations with frameworks, each behind its extra (``celery_fencing.contrib.django``: ``[django]``)."""
