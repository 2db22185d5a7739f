"""The Spark side of the platform, in rooms:

* :mod:`spark_jobs.driver` — a job version's driver process: ``run`` (its entry point), the Spark session, the job
  context a declaration's ``build`` sees, the batch sink, the lease, the lifecycle it publishes, the spare driver,
  the spark-submit command, metrics and failpoints.
* :mod:`spark_jobs.io` — what a job reads and writes besides its state: Kafka topics, re-keying through a
  repartition topic, dead letters, output tables (and their maintenance), the rows a small batch brings to the driver.
* :mod:`spark_jobs.state` — a store's state: changelog topics, fencing, Delta snapshots, restore, migration.
* :mod:`spark_jobs.primitives` — the processing patterns a job declares (aggregates, windows, sessions, joins, top-N).
* :mod:`spark_jobs.batch` — batch jobs over the streams' outputs, run by their DAGs.
* :mod:`spark_jobs.operations` — what Airflow runs beside the drivers: reprocessing, the state-size audit,
  changelog tuning, table maintenance, the warm standby.
* :mod:`spark_jobs.reference` — the reference jobs and the event generators their tests and benchmarks feed.

Beside them, the names every room shares: :mod:`~spark_jobs.registry` (job specs), :mod:`~spark_jobs.layout`
(every name and path a job version owns), :mod:`~spark_jobs.versions` (the current version of each job),
:mod:`~spark_jobs.documents` (typed documents as JSON), :mod:`~spark_jobs.scaffold` and :mod:`~spark_jobs.testing`.
"""
