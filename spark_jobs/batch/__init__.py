"""Batch steps over streaming outputs: a :class:`~spark_jobs.batch.spec.BatchJob` runs from an Airflow
schedule (``dags/batch_jobs.py``), one data interval per run, over the Delta outputs of streaming jobs read
as of the interval's settle time, and replaces that interval's rows in a Delta table of its own.

* :mod:`spark_jobs.batch.intervals`: the rules (what an interval reads and replaces), no I/O;
* :mod:`spark_jobs.batch.spec`: the declaration and the registry of batch jobs;
* :mod:`spark_jobs.batch.runner`: the Spark application that runs one interval.
"""
