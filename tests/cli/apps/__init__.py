"""Celery apps the doctor tests load with ``celery-fencing doctor -A``, configured by ``CFT_*`` variables."""
