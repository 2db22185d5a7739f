"""A job version's driver process: :mod:`.run` is its entry point (spark-submit runs ``spark_jobs/driver/run.py``);
:mod:`.session` builds its Spark session; :mod:`.context` is what a declaration's ``build`` sees, and
:mod:`.batch_sink` what happens to each micro-batch; :mod:`.lease` keeps one driver per version on a host and
:mod:`.lifecycle` is what it publishes; :mod:`.spare` is the warm spare driver; :mod:`.submit` the spark-submit
command; :mod:`.metrics` its Prometheus endpoint; :mod:`.failpoints` where fault tests stop it."""
