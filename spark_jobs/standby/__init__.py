"""Warm standby: snapshot followers that keep each store's Delta snapshot within a bounded lag of its changelog."""

from spark_jobs.standby.follower import SnapshotFollower, StoreFollower, read_standby_status, standby_running

__all__ = ["SnapshotFollower", "StoreFollower", "read_standby_status", "standby_running"]
