"""State-size audit: how big every store is, how long its restore would take today, how fast it grows
and when it will break its budget.

- :mod:`.rows`: the rows, typed (:class:`~.rows.StoreAudit`, one per store and audit; the checkpoint
  reader's :class:`~.rows.CheckpointStateRow`), written to and read from their Delta tables in one place.
- :mod:`.checkpoint_state`: a Spark application reading the live state out of each checkpoint with
  Spark's ``state-metadata`` and ``statestore`` readers (rows and bytes per partition).
- :mod:`.collect`: everything else per store, without Spark: the job's latest progress, checkpoint
  size on disk, Delta snapshots (delta-rs), the changelog (the compaction tuning DAG's measurements,
  not measured twice), the dead-letter topic, restore-time estimates from measured restores.
- :mod:`.trends`: growth per day, days until a budget is crossed, unbounded growth.
- :mod:`.ttl`: whether a declared TTL evicts idle keys, measured on the changelog (or the latest snapshot).
- :mod:`.report`: the HTML report with PNG charts.

The Airflow side is ``plugins/streamstate/operators/state_audit.py`` and ``dags/audit_state_size.py``.
"""
