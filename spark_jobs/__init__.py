"""The Spark side: job registry, session factory, Kafka topics, event generators and reference jobs."""
