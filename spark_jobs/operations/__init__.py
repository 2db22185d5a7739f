"""What Airflow runs beside the drivers: :mod:`.reprocess` (side by side, reset, migrate, promote),
:mod:`.state_audit` (state size, growth and budgets), :mod:`.changelog_tuning` (changelog compaction measured and
tuned), :mod:`.maintenance` (the platform's Delta tables compacted and vacuumed), :mod:`.standby` (the warm
standby that keeps snapshots current)."""
