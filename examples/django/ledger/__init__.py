"""The ledger app: accounts and one entry per applied deposit."""
