"""A user's test suite for a fenced task: the app (app.py) and its tests, in-process and with real workers."""
