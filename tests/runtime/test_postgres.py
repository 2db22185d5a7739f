"""The stack's PostgreSQL (Airflow's metadata as deployed): made once, its database kept across restarts, started
and stopped as the stack's other services; under root, run as Debian's postgres user."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from runtime.postgres import LocalPostgres
from runtime.process import free_port
from runtime.settings import Settings

pytestmark = pytest.mark.integration


def test_a_database_made_once_kept_across_a_restart(tmp_path):
    import psycopg2

    home = Path(tempfile.mkdtemp(prefix="streamstate-postgres-"))
    home.chmod(0o755)  # under root the server runs as the postgres user, which must reach it
    postgres = LocalPostgres(Settings(data_dir=tmp_path), free_port(), home=home / "postgres")
    try:
        postgres.start()
        assert postgres.url == f"postgresql+psycopg2://streamstate@127.0.0.1:{postgres.port}/airflow"
        with psycopg2.connect(host="127.0.0.1", port=postgres.port, user="streamstate", dbname="airflow") as conn:
            with conn.cursor() as cursor:
                cursor.execute("CREATE TABLE kept (n int); INSERT INTO kept VALUES (7)")
        conn.close()
        assert postgres.stop() and not postgres.service.is_running()
        postgres.start()  # the cluster and its database are reused
        with psycopg2.connect(host="127.0.0.1", port=postgres.port, user="streamstate", dbname="airflow") as conn:
            with conn.cursor() as cursor:
                cursor.execute("SELECT n FROM kept")
                assert cursor.fetchall() == [(7,)]
        conn.close()
    finally:
        postgres.stop()
        shutil.rmtree(home, ignore_errors=True)
    assert not postgres.stop(), "nothing runs any more"
