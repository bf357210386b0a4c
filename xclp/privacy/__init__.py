"""Differential privacy: the privacy ledger of a run or job, and the mechanisms that spend from it."""
