"""Aggregation: a sweep's committed trees -> SFT, DPO, revision and token-level datasets.

Entry point: `thicket.aggregate.driver.aggregate` (the `thicket aggregate` command).
"""
