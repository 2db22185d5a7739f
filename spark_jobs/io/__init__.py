"""What a job reads and writes besides its state: :mod:`.kafka_topics` (topics, offsets, partitioning as Kafka's
Java clients do), :mod:`.repartition` (re-keying a source through a repartition topic), :mod:`.dead_letter` (bad
input as dead-letter records), :mod:`.output_table` and :mod:`.table_maintenance` (Delta output tables and their
compaction and vacuum), :mod:`.driver_rows` (a small batch's rows collected by the job that computes them)."""
