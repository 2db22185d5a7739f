"""State management: changelog topics, batch markers, changelog reading (and later snapshots, restore).

One owner per artifact, as in Kafka Streams' internals:

* :mod:`.changelog` — the changelog topic of a store (name, configs) and the writer that appends
  every state change of a micro-batch plus its batch marker. Knows nothing about Delta.
* :mod:`.checkpoint_offsets` — reads which input offsets a micro-batch consumed from the query's
  checkpoint (Spark's offset log is the source of truth for input positions).
* :mod:`.changelog_reader` — reads a changelog from given offsets and cuts it at the last complete batch.
"""
