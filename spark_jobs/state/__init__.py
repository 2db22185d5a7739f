"""State management: changelog topics, snapshots, restore, and what a store's processor hands them.

One owner per artifact, as in Kafka Streams' internals (the names themselves come from
:mod:`spark_jobs.layout`):

* :mod:`.batch_records` — the records of a micro-batch's changelog transaction as written and read: the batch
  marker, its key and header, the records written with it. No I/O; the writers and readers below import it.
* :mod:`.changelog` — the changelog topic of a store (configs) and the writer that appends every state
  change of a micro-batch plus its batch marker. Knows nothing about Delta.
* :mod:`.cut_rules` — where a changelog is cut and which of its records a restore applies: the rules, no
  I/O, one planner for both readers below.
* :mod:`.changelog_reader` — reads a changelog from given offsets and cuts it at the last complete batch
  (shared by restore, the warm standby and the state API).
* :mod:`.changelog_spark` — the same read by Spark's Kafka batch source, for stores restored by executors.
* :mod:`.fencing` — one writer per job version across hosts: the transactional producer's epoch and the
  drivers' generations.
* :mod:`.checkpoint_offsets` — which input offsets a micro-batch consumed, from the query's checkpoint
  (Spark's offset log is the source of truth for input positions).
* :mod:`.source_position` — how far a job version has consumed its source, a re-keyed one through both
  of its stages (what reprocessing, the catch-up wait and promotion read).
* :mod:`.input_lag` — which inputs of a join have records written beyond a micro-batch, read once per batch
  and kept with the checkpoint, so a task takes both topics in time order however the input is cut.
* :mod:`.checkpoint_health` — whether a checkpoint can be resumed from; quarantines one that cannot.
* :mod:`.snapshots` — ``SnapshotStore``, the only reader and writer of a store's Delta snapshot table.
* :mod:`.snapshotting` — where a snapshot is made: a short tail as a layer, else the rebuilt state.
* :mod:`.restore` — rebuilds a store: latest snapshot plus the changelog tail; restore listeners.
* :mod:`.restore_history` — restore throughput measured here, and restore-time estimates from it.
* :mod:`.store_changes` — from a processor's output rows to changelog records, and back to initial state.
* :mod:`.output_marks` — the input offsets each output commit reached, so a replay never appends twice.
* :mod:`.migration` — a new version's stores built from the previous version's state (and Flink's State
  Processor API roles: read a store as a DataFrame, bootstrap one from a table).
"""
