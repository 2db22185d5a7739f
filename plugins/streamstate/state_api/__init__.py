"""The state query API (FastAPI): a job's current state by key or range, live or from the warm standby."""
