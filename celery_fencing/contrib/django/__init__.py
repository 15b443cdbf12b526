"""The Django app behind :class:`~celery_fencing.gates.django.DjangoGate`: the mark model and its migration.

Add ``"celery_fencing.contrib.django"`` to ``INSTALLED_APPS`` and run
``manage.py migrate celery_fencing``. The app's label is ``celery_fencing``.
"""
