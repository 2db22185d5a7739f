"""The alert ledger (plugins/streamstate/alert_ledger.py): every open alert of every source in one file;
fired once, resolved once; an alert no channel took is not recorded, so the next check tries again; and
writers in several processes at once keep every record. Sending is a stand-in for ``routing.send``."""

from __future__ import annotations

import json

import pytest
from streamstate.alert_ledger import AlertLedger
from streamstate.alerts import FIRING, RESOLVED, OpenAlert, dedup_key
from streamstate.supervision import Condition, SupervisionRecord

APP = "purchase_counts-v2"


def condition(name: str, severity: str = "error") -> Condition:
    return Condition(name, severity, f"{name} holds", {"n": 1}, f"fix {name}")


class Channels:
    """The stand-in for ``routing.send``: every alert it is given, in order; ``failing`` dedup keys are
    refused by every channel."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self.failing: set[str] = set()

    def __call__(self, alert, context) -> dict[str, str]:
        self.sent.append((alert.condition, alert.status))
        if alert.dedup_key in self.failing:
            return {"webhook": "error: 503", "slack": "error: timeout"}
        return {"webhook": "sent"}


@pytest.fixture
def channels(monkeypatch) -> Channels:
    fake = Channels()
    monkeypatch.setattr("streamstate.notifiers.routing.send", fake)
    return fake


def check(ledger: AlertLedger, conditions, source="supervision", app=APP, scope=None):
    return ledger.reconcile_and_send(
        {}, job=app.rsplit("-v", 1)[0], application_id=app, source=source, conditions=conditions, scope=scope
    )


def test_fires_once_resolves_once_with_the_dedup_key_alerts_always_had(tmp_path, channels):
    ledger = AlertLedger(tmp_path)
    first = check(ledger, [condition("down", "critical")])
    assert first.fired_conditions == ["down"] and first.resolved == () and first.undelivered == ()
    assert first.fired[0].dedup_key == dedup_key(APP, "down") == "streamstate/purchase_counts-v2/down"
    (opened,) = AlertLedger(tmp_path).open_alerts(APP)  # read back from the file, typed
    assert opened == OpenAlert(
        APP, "supervision", "down", "purchase_counts", "critical", "down holds", opened.dedup_key, first.fired[0].at
    )
    assert check(ledger, [condition("down", "critical")]).fired == ()  # still holding: nothing sent
    gone = check(ledger, [])
    assert [(a.condition, a.status, a.dedup_key, a.severity) for a in gone.resolved] == [
        ("down", RESOLVED, dedup_key(APP, "down"), "critical")
    ]
    assert "open since" in gone.resolved[0].summary
    assert ledger.open_alerts() == []
    assert channels.sent == [("down", FIRING), ("down", RESOLVED)]


def test_sources_jobs_and_scopes_keep_their_own_alerts(tmp_path, channels):
    ledger = AlertLedger(tmp_path)
    check(ledger, [condition("down")])
    check(ledger, [condition("standby_down")], source="standby")
    check(
        ledger,
        [condition("changelog_replay_counts", "warning")],
        source="changelog_tuning",
        scope={"changelog_replay_counts"},
    )
    check(
        ledger,
        [condition("changelog_replay_totals", "warning")],
        source="changelog_tuning",
        scope={"changelog_replay_totals"},
    )
    check(ledger, [condition("state_budget_counts")], source="state_audit", scope={"state_budget_counts"})
    check(ledger, [condition("down")], app="vote_counts-v1")
    assert {(a.source, a.condition) for a in ledger.open_alerts(APP)} == {
        ("supervision", "down"),
        ("standby", "standby_down"),
        ("changelog_tuning", "changelog_replay_counts"),
        ("changelog_tuning", "changelog_replay_totals"),
        ("state_audit", "state_budget_counts"),
    }
    # supervision finds nothing holding: only its own alert of this job version resolves
    assert check(ledger, []).resolved_conditions == ["down"]
    # the tuner decides one store at a time: the other store's alert stays open
    assert check(ledger, [], source="changelog_tuning", scope={"changelog_replay_counts"}).resolved_conditions == [
        "changelog_replay_counts"
    ]
    assert {(a.application_id, a.source, a.condition) for a in ledger.open_alerts()} == {
        (APP, "standby", "standby_down"),
        (APP, "changelog_tuning", "changelog_replay_totals"),
        (APP, "state_audit", "state_budget_counts"),
        ("vote_counts-v1", "supervision", "down"),
    }
    assert [a.condition for a in ledger.open_alerts(APP, "state_audit")] == ["state_budget_counts"]
    with pytest.raises(ValueError, match="outside the check's scope"):
        check(ledger, [condition("state_budget_totals")], source="state_audit", scope={"state_budget_counts"})
    with pytest.raises(ValueError, match="source"):
        check(ledger, [], source="elsewhere")


def test_an_alert_no_channel_took_is_not_recorded_and_the_next_check_tries_again(tmp_path, channels):
    ledger = AlertLedger(tmp_path)
    channels.failing = {dedup_key(APP, "input_lag")}
    first = check(ledger, [condition("down"), condition("input_lag")])
    assert first.fired_conditions == ["down", "input_lag"]
    assert [(a.condition, results["webhook"]) for a, results in first.undelivered] == [("input_lag", "error: 503")]
    # the delivered one is recorded whatever happened to the other: it is not sent twice
    assert [a.condition for a in ledger.open_alerts(APP)] == ["down"]
    again = check(ledger, [condition("down"), condition("input_lag")])
    assert again.fired_conditions == ["input_lag"] and len(again.undelivered) == 1
    channels.failing = set()
    assert check(ledger, [condition("down"), condition("input_lag")]).fired_conditions == ["input_lag"]
    assert sorted(a.condition for a in ledger.open_alerts(APP)) == ["down", "input_lag"]

    # a resolve that is not delivered leaves the alert open; the next check resolves it
    channels.failing = {dedup_key(APP, "down")}
    failed = check(ledger, [condition("input_lag")])
    assert failed.resolved_conditions == ["down"] and len(failed.undelivered) == 1
    assert sorted(a.condition for a in ledger.open_alerts(APP)) == ["down", "input_lag"]
    channels.failing = set()
    assert check(ledger, [condition("input_lag")]).resolved_conditions == ["down"]
    assert [a.condition for a in ledger.open_alerts(APP)] == ["input_lag"]
    assert channels.sent.count(("input_lag", FIRING)) == 3 and channels.sent.count(("down", FIRING)) == 1
    assert channels.sent.count(("down", RESOLVED)) == 2


def test_the_file_is_one_document_of_typed_records(tmp_path, channels):
    ledger = AlertLedger(tmp_path)
    check(ledger, [condition("down")])
    document = json.loads(ledger.path.read_text())
    assert ledger.path == tmp_path / "alert_ledger" / "open.json"
    assert document["format"] == 1 and [r["condition"] for r in document["open"]] == ["down"]
    assert set(document["open"][0]) == {
        "application_id",
        "source",
        "condition",
        "job",
        "severity",
        "summary",
        "dedup_key",
        "opened_at",
    }
    assert AlertLedger(tmp_path / "elsewhere").open_alerts() == []  # no file yet: nothing open


def test_a_supervision_record_written_before_the_ledger_still_reads():
    legacy = {"application_id": APP, "open_alerts": {"down": {"opened_at": "t", "dedup_key": "k"}}, "launches": []}
    record = SupervisionRecord.from_json(json.dumps(legacy))
    assert record.application_id == APP and "open_alerts" not in json.loads(record.to_json())


def test_alerts_open_before_the_ledger_are_taken_over_not_repeated(tmp_path, channels):
    """An upgrade: the alerts the checks kept in their own places are the ledger's first records, so a
    condition that still holds is not announced again and one that cleared is resolved (same dedup key)."""

    def opened(condition: str, severity: str = "error") -> dict:
        return {"opened_at": "2026-01-01T00:00:00+00:00", "dedup_key": dedup_key(APP, condition), "severity": severity}

    record = {"application_id": APP, "launches": [], "open_alerts": {"down": opened("down", "critical")}}
    (tmp_path / f"{APP}.supervision.json").write_text(json.dumps(record))
    standby = {
        "application_id": f"{APP}.standby",
        "launches": [],
        "open_alerts": {"standby_down": opened("standby_down")},
    }
    (tmp_path / f"{APP}.standby.supervision.json").write_text(json.dumps(standby))
    for folder, name in (("changelog_tuning", "changelog_replay_counts"), ("state_audit", "state_budget_counts")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "open_alerts.json").write_text(json.dumps({APP: {name: opened(name)}}))

    ledger = AlertLedger(tmp_path)
    still = check(ledger, [condition("down", "critical")])  # the first check after the upgrade
    assert still.fired == () and still.resolved == ()
    assert {(a.source, a.condition, a.job) for a in ledger.open_alerts(APP)} == {
        ("supervision", "down", "purchase_counts"),
        ("standby", "standby_down", "purchase_counts"),
        ("changelog_tuning", "changelog_replay_counts", "purchase_counts"),
        ("state_audit", "state_budget_counts", "purchase_counts"),
    }
    assert not (tmp_path / "changelog_tuning" / "open_alerts.json").exists()
    assert not (tmp_path / "state_audit" / "open_alerts.json").exists()
    cleared = check(ledger, [], source="standby")
    assert [(a.condition, a.dedup_key) for a in cleared.resolved] == [("standby_down", dedup_key(APP, "standby_down"))]
    assert channels.sent == [("standby_down", RESOLVED)]


SOURCES_BY_WORKER = ("supervision", "standby", "changelog_tuning", "state_audit")


def _check_many(args) -> int:
    """One process's checks (a supervise DAG, the standby check, the tuner, the audit): each fires an alert
    of its own job version and source, resolves every third one, and fires them again."""
    status_dir, worker = args
    ledger = AlertLedger(status_dir)
    source = SOURCES_BY_WORKER[worker % 4]
    for i in range(12):
        app = f"job{worker}-v{i}"
        check(ledger, [condition(f"c{worker}")], source=source, app=app)
        if i % 3 == 0:
            check(ledger, [], source=source, app=app)
    return worker


def test_concurrent_writers_in_several_processes_keep_every_record(tmp_path, channels):
    """Checks in 4 processes at once (each a read-modify-write of the one file): no record is lost to
    another process's rewrite, none is left that was resolved."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(4) as pool:
        assert sorted(pool.map(_check_many, [(tmp_path, w) for w in range(8)])) == list(range(8))
    kept = {(a.application_id, a.source, a.condition) for a in AlertLedger(tmp_path).open_alerts()}
    assert kept == {
        (f"job{w}-v{i}", SOURCES_BY_WORKER[w % 4], f"c{w}") for w in range(8) for i in range(12) if i % 3 != 0
    }
