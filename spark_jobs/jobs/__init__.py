"""Reference jobs. Each module exposes ``build(spark, spec, settings) -> DataStreamWriter``."""
