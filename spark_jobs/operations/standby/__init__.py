"""Warm standby: snapshot followers that keep each store's Delta snapshot within a bounded lag of its changelog.

What the standby publishes (``StandbyStatus``, ``read_standby_status``) lives in :mod:`spark_jobs.driver.lifecycle`,
beside the driver's: Airflow reads it without importing the follower."""

from spark_jobs.operations.standby.follower import SnapshotFollower, StoreFollower, standby_running

__all__ = ["SnapshotFollower", "StoreFollower", "standby_running"]
