"""The ``streamstate`` command (``python -m streamstate_cli``): the local stack, the demo ``make run`` runs,
set-up's JVM steps, the state API on its own, ``new-job``. The top floor: it uses ``runtime`` (the stack
and the settings), ``spark_jobs`` (the jobs) and ``plugins`` (the state API app); nothing imports it.
"""
