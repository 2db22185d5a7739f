"""Reference jobs. Each module exposes ``build(ctx: JobContext) -> DataStreamWriter``."""
