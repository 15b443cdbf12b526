"""A bank ledger on PostgreSQL: ``python -m examples.bank_ledger`` (see tasks.py)."""
