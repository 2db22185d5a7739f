"""Reprocessing: side by side under a new version, or reset in place (the application reset tool).

``positions`` resolves where to start, ``plan`` says everything a run would touch (the dry run),
``reset`` executes a reset under the job's lease, ``compare`` writes the old-vs-new report,
``audit`` records every run. The Airflow side is ``dags/reprocess_jobs.py`` over plugins/streamstate.
"""
