"""The compiled request lanes' counters (issue 38, ``docs/request-lanes.md``) as Prometheus families.

The counters are the lanes' own, kept per process (:func:`tidemq.broker.lanes.lane_counts`): a
broker is one process, so they are its figures; 0 where a lane is not built or switched off.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, Metric

from tidemq.broker.lanes import lane_counts


def lane_families() -> list[Metric]:
    """``tidemq_send_lane_runs_total{served_by}`` (runs of sends the compiled prepare step took,
    ``lane``, or refused to the Python handler, ``python``), ``tidemq_read_lane_frames_total`` (send
    frames the read lane took from a read's bytes), ``tidemq_read_lane_answers_total`` (reads it
    answered with compiled bytes), ``tidemq_pull_lane_pulls_total{served_by}`` and
    ``tidemq_lane_acl_checks_total{outcome}`` (requests the ACL's lane check admitted, ``admitted``,
    or left to ``validate``, ``to_python``)."""
    counts = lane_counts()
    runs = CounterMetricFamily(
        "tidemq_send_lane_runs",
        "Runs of sends the compiled send lane served (lane) or handed to the Python handler (python)",
        labels=["served_by"],
    )
    runs.add_metric(["lane"], counts["send_runs_served"])
    runs.add_metric(["python"], counts["send_runs_to_python"])
    frames = CounterMetricFamily(
        "tidemq_read_lane_frames", "Send frames the read lane took from a read's bytes"
    )
    frames.add_metric([], counts["read_frames_taken"])
    answers = CounterMetricFamily(
        "tidemq_read_lane_answers", "Reads the read lane answered with compiled response bytes"
    )
    answers.add_metric([], counts["read_answers"])
    pulls = CounterMetricFamily(
        "tidemq_pull_lane_pulls",
        "Pulls the compiled pull lane served (lane) or handed to the Python handler (python)",
        labels=["served_by"],
    )
    pulls.add_metric(["lane"], counts["pull_served"])
    pulls.add_metric(["python"], counts["pull_to_python"])
    acl = CounterMetricFamily(
        "tidemq_lane_acl_checks",
        "Requests the access validator's lane check admitted (admitted) or left to validate (to_python)",
        labels=["outcome"],
    )
    acl.add_metric(["admitted"], counts["acl_admitted"])
    acl.add_metric(["to_python"], counts["acl_to_python"])
    return [runs, frames, answers, pulls, acl]
