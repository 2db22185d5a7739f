"""Fuzz the reprocessing trigger form (Airflow Params + the plan, real Airflow and Kafka): whatever a
person types, the run is refused by the form's validation or by the plan with a clear reason
(``BadReprocessRequest``), or a plan is made. Never another exception: that would be a crash with a
stack trace where the on-call engineer expected a sentence.
"""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from runtime.settings import PROJECT_ROOT
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.operations.reprocess.plan import BadReprocessRequest, make_plan
from spark_jobs.registry import latest_jobs

pytestmark = pytest.mark.integration

NOW = dt.datetime(2026, 11, 1, 12, tzinfo=dt.timezone.utc)
anything = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=10)
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
)
# Values a person might plausibly type, per field; each field is also sometimes anything at all.
PLAUSIBLE = {
    "job": st.sampled_from([*latest_jobs(), "no_such_job", ""]),
    "mode": st.sampled_from(["side_by_side", "reset", "RESET", ""]),
    "version": st.none() | st.integers(-1, 5),
    "start_from": st.sampled_from(["earliest", "datetime", "duration", "offsets", "latest"]),
    "start_datetime": st.none()
    | st.sampled_from(
        [
            "2026-10-31T09:00:00Z",
            "2026-10-31 09:00",
            "2099-01-01T00:00:00Z",
            "2026-02-30T00:00:00Z",
            "0001-01-01T00:00:00+14:00",
            "yesterday",
        ]
    ),
    "start_duration": st.none()
    | st.sampled_from(["6h", "90m", "2d", "PT6H", "P1D", "0s", "99999999d", "P", "6 h", "-1h"]),
    "start_offsets": st.none()
    | st.dictionaries(st.sampled_from(["0", "1", "7", "x", "-1"]), st.integers(-5, 10**19), max_size=3)
    # per topic, for a job reading two streams (a join), or a topic it does not read
    | st.dictionaries(
        st.sampled_from(["placed-orders", "payments", "purchases", "0"]),
        st.dictionaries(st.sampled_from(["0", "1", "x"]), st.integers(-5, 10**19), max_size=2) | st.integers(0, 9),
        max_size=2,
    ),
    "truncate_outputs": st.booleans(),
    "dry_run": st.just(True) | st.booleans(),
    "confirm": st.none() | st.sampled_from([*latest_jobs(), "yes"]),
    "catch_up_timeout_min": st.integers(-1, 10**6),
}


@st.composite
def forms(draw) -> dict:
    form = {}
    for name, plausible in PLAUSIBLE.items():
        choice = draw(st.integers(0, 9))
        if choice == 0:
            continue  # left at the form's default
        form[name] = draw(anything) if choice == 1 else draw(plausible)
    return form


@pytest.fixture(scope="module")
def reprocess_dag(tmp_path_factory):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(PROJECT_ROOT / "dags" / "reprocess_jobs.py"))
    assert bag.import_errors == {}
    return bag.dags["reprocess_job"]


def test_any_reprocessing_form_is_planned_or_refused_with_a_reason(kafka_broker, settings, reprocess_dag):
    from airflow.sdk.definitions.param import ParamValidationError, process_params

    for spec in latest_jobs().values():  # the inputs exist (empty): a plan can be made
        for topic in spec.input_topics:
            ensure_topic(settings.kafka_bootstrap_servers, topic, spec.source_partitions)
    outcomes = {"refused by the form": 0, "refused by the plan": 0, "planned": 0}

    # A form costs milliseconds (a plan, a few Kafka metadata reads): five times the profile's examples.
    @hypothesis_settings(max_examples=hypothesis_settings.default.max_examples * 5)
    @given(forms())
    # one form of each outcome whatever the draw (the draws follow the registry, which grows)
    @example({"job": "purchase_counts", "mode": "reset", "start_from": "earliest", "dry_run": True})
    @example({"job": "purchase_counts", "mode": "reset", "start_from": "offsets", "dry_run": True})
    @example({"job": "purchase_counts", "mode": "sideways"})
    @example({"job": "order_payments", "mode": "reset", "start_from": "offsets", "start_offsets": {"0": 1}})
    @example({"job": "order_payments", "mode": "reset", "start_from": "offsets", "start_offsets": {"payments": {}}})
    # starts before 1970 (ListOffsets took a negative time for a sentinel: UNSUPPORTED_VERSION) and before year 1
    @example({"job": "vote_counts", "start_from": "datetime", "start_datetime": "0001-01-01T10:00:00Z"})
    @example({"job": "vote_counts", "start_from": "duration", "start_duration": "99999999d"})
    def check(form):
        try:  # what the task runner does with the trigger form's conf before the plan task runs
            values = process_params(reprocess_dag, reprocess_dag.get_task("plan"), form, suppress_exception=False)
        except ParamValidationError:
            outcomes["refused by the form"] += 1
            return
        try:
            plan = make_plan(settings, dict(values), now=NOW)
        except BadReprocessRequest as err:
            assert str(err), form
            outcomes["refused by the plan"] += 1
            return
        assert plan.job == values["job"] and plan.mode == values["mode"]
        outcomes["planned"] += 1

    check()
    assert all(outcomes.values()), outcomes  # the fuzzer reached every outcome
