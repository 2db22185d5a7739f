"""The reference jobs (:mod:`.jobs`, one per processing pattern, each with its Kafka Streams twin in
``bench/kafka_streams/``) and the event generators (:mod:`.generators`) their tests and benchmarks feed."""
