"""State management: changelog topics, snapshots, restore, and what a store's processor hands them.

One owner per artifact, as in Kafka Streams' internals (the names themselves come from
:mod:`spark_jobs.layout`):

* :mod:`.changelog` — the changelog topic of a store (configs) and the writer that appends every state
  change of a micro-batch plus its batch marker. Knows nothing about Delta.
* :mod:`.changelog_reader` — reads a changelog from given offsets and cuts it at the last complete batch
  (shared by restore, the warm standby and the state API).
* :mod:`.checkpoint_offsets` — which input offsets a micro-batch consumed, from the query's checkpoint
  (Spark's offset log is the source of truth for input positions).
* :mod:`.checkpoint_health` — whether a checkpoint can be resumed from; quarantines one that cannot.
* :mod:`.snapshots` — ``SnapshotStore``, the only reader and writer of a store's Delta snapshot table.
* :mod:`.restore` — rebuilds a store: latest snapshot plus the changelog tail; restore listeners.
* :mod:`.restore_history` — restore throughput measured here, and restore-time estimates from it.
* :mod:`.store_changes` — from a processor's output rows to changelog records, and back to initial state.
* :mod:`.jvm_processor` — calling a Java ``transformWithState`` processor from a Python job.
"""
