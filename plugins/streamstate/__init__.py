"""The Airflow side of streamstate, shaped like an Airflow provider package.

- ``hooks``: :class:`~streamstate.hooks.streaming_job.StreamingJobHook` (an Airflow hook of the Spark
  connection, ``spark_default``) owns one job's runtime files (lease, status, supervision record), builds its
  driver's spark-submit from the connection, launches detached drivers and stops them.
- ``operators``: thin over the hooks: launch (a detached driver: it does not hold the worker slot), stop, check.
- ``triggers``: wait for a launched driver to run, or for a stopped one to let go of its lease.
- ``notifiers``: the webhook notifier and the routing to Slack / PagerDuty / SMTP notifiers.
- ``supervision`` / ``alerts``: the pure decisions (restart? crash loop? which alerts open/resolve?).
- ``ui``: the "Streaming jobs" page (FastAPI app, registered by ``plugins/streamstate_plugin.py``).
"""
