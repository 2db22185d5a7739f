"""Changelog compaction tuning: measure every changelog topic, recommend topic configs from the
measurements and the store's kind, apply them (and roll them back), and keep the history.

- :mod:`.measure`: what a topic holds (records, bytes, live keys, tombstones, dirty ratio, age of the
  oldest record compaction could remove) by a bounded scan plus the broker's log directories.
- :mod:`.recommend`: pure rules, each with its reason in numbers.
- :mod:`.topic_configs`: describe / incremental-alter / roll back topic configs with the AdminClient.
- :mod:`.history`: the Delta tables every measurement and decision goes to.

The Airflow side is ``plugins/streamstate/operators/changelog_tuning.py`` and
``dags/tune_changelogs.py``.
"""
