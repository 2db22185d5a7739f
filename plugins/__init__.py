"""The Airflow side: hooks, operators, triggers, notifiers and UI (grown by the Airflow issues)."""
