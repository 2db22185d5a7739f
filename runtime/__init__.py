"""The local runtime: typed settings, pinned versions, JVM jars and the embedded stack (Kafka, Airflow)."""
