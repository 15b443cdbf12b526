"""Models the Django gate tests write through (tables made by ``migrate --run-syncdb``)."""
