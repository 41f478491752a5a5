"""Job chains (``jobs.chains``): the rules (cycles, names), their checks in every write of a
definition (services, API, ``jobs apply``), and the runs a final outcome makes
(``jobs.executions``), written with the outcome and never twice."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from jobs import chains, executions, services
from jobs.management.commands.jobs import EXIT_USAGE
from jobs.models import Job, JobExecution, Trigger
from jobs.services import SYSTEM, ActionNotAllowed, job_create
from jobs.states import ExecutionStatus
from jobs.validation import JobValidationError

S = ExecutionStatus


# --- the rules, pure ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("graph", "start", "cycle"),
    [
        ({}, "a", None),
        ({"a": ["b"]}, "a", None),
        ({"a": ["b"], "b": ["a"]}, "a", ["a", "b", "a"]),
        ({"a": ["b"], "b": ["c"], "c": ["a"]}, "a", ["a", "b", "c", "a"]),
        ({"a": ["b"], "b": ["c"], "c": ["b"]}, "a", None),  # a cycle not through a
        ({"a": ["b", "c"], "b": ["d"], "c": ["d"], "d": []}, "a", None),  # a diamond
        ({"a": ["a"]}, "a", ["a", "a"]),
    ],
)
def test_find_cycle(graph, start, cycle):
    assert chains.find_cycle(graph, start) == cycle


def test_a_long_chain_is_walked_without_recursion():
    graph = {f"j{k}": [f"j{k + 1}"] for k in range(5000)}
    graph["j5000"] = ["j0"]
    assert len(chains.find_cycle(graph, "j0")) == 5002


@pytest.mark.parametrize(
    ("status", "attempt", "max_retries", "final"),
    [
        (S.SUCCEEDED, 1, 3, True),
        (S.FAILED, 1, 0, True),
        (S.FAILED, 1, 2, False),  # retried: not the last word
        (S.FAILED, 3, 2, True),  # the last attempt
        (S.LOST, 2, 2, False),
        (S.TIMED_OUT, 3, 2, True),
    ],
)
def test_is_final(status, attempt, max_retries, final):
    assert chains.is_final(status=status, attempt=attempt, max_retries=max_retries) is final


def test_which_outcome_fires_which_list():
    job = Job(on_success=["s", "both"], on_failure=["f"], on_end=["both", "e"])
    assert chains.targets(job, S.SUCCEEDED) == ["s", "both", "e"]
    for status in (S.FAILED, S.TIMED_OUT, S.LOST):
        assert chains.targets(job, status) == ["f", "both", "e"]
    for status in (S.CANCELLED, S.SKIPPED):
        assert chains.targets(job, status) == []


def test_check_definitions_names_the_job_the_field_and_the_cycle():
    stored = {"b": {"on_failure": ["c"]}, "c": {"on_end": ["a"]}}
    problems = chains.check_definitions(
        {"a": {"on_success": ["x"], "on_end": ["b"]}}, stored=stored, known={"a", "b", "c", "x"}
    )
    assert problems == [
        chains.Problem("a", "on_end", chains.ERR_CYCLE.format(path="a → b → c → a"))
    ]
    unknown = chains.check_definitions({"a": {"on_success": ["nope"]}}, stored={}, known={"a"})
    assert unknown == [
        chains.Problem("a", "on_success", chains.ERR_UNKNOWN_TARGET.format(name="nope"))
    ]


# --- definitions ----------------------------------------------------------------------------------


def make(name, **fields):
    data = {"name": name, "task": "noop", "schedule_type": "interval", "interval_seconds": 60}
    return job_create(data={**data, **fields}, by=SYSTEM)


@pytest.mark.django_db
def test_a_self_loop_is_refused_with_the_field():
    with pytest.raises(JobValidationError) as caught:
        make("a", on_success=["a"])
    assert caught.value.errors == {"on_success": [chains.ERR_SELF]}


@pytest.mark.django_db
def test_an_unknown_name_is_refused_and_names_are_compared_exactly():
    make("Report")
    with pytest.raises(JobValidationError) as caught:
        make("a", on_failure=["report"])
    assert caught.value.errors == {"on_failure": [chains.ERR_UNKNOWN_TARGET.format(name="report")]}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("b", chains.ERR_NOT_NAMES),
        (["b", "b"], chains.ERR_DUPLICATE.format(name="b")),
        ([f"j{k}" for k in range(21)], chains.ERR_TOO_MANY.format(limit=20)),
    ],
)
def test_a_malformed_chain_is_refused(value, message):
    make("b")
    with pytest.raises(JobValidationError) as caught:
        make("a", on_end=value)
    assert message in caught.value.errors["on_end"]


@pytest.mark.django_db
def test_a_cycle_through_an_update_is_refused():
    a = make("a")
    make("b", on_success=["a"])
    with pytest.raises(JobValidationError) as caught:
        services.job_update(
            job_id=a.pk, expected_version=a.version, changes={"on_failure": ["b"]}, by=SYSTEM
        )
    assert caught.value.errors == {"on_failure": [chains.ERR_CYCLE.format(path="a → b → a")]}
    assert Job.objects.get(pk=a.pk).on_failure == []


@pytest.mark.django_db
def test_a_batch_may_chain_to_its_own_jobs_but_not_in_a_cycle():
    items = [
        {
            "name": "x",
            "task": "noop",
            "schedule_type": "interval",
            "interval_seconds": 60,
            "on_success": ["y"],
        },
        {"name": "y", "task": "noop", "schedule_type": "interval", "interval_seconds": 60},
    ]
    services.jobs_create_batch(items=items, by=SYSTEM)
    assert Job.objects.get(name="x").on_success == ["y"]
    looped = [
        {**items[0], "name": "p", "on_success": ["q"]},
        {**items[1], "name": "q", "on_end": ["p"]},
    ]
    with pytest.raises(JobValidationError) as caught:
        services.jobs_create_batch(items=looped, by=SYSTEM)
    assert set(caught.value.errors) == {"0.on_success", "1.on_end"}


@pytest.mark.django_db
def test_a_job_chained_to_is_not_deleted_or_renamed_from_under_its_chain():
    b = make("b")
    make("a", on_success=["b"])
    with pytest.raises(ActionNotAllowed, match=r"a \(on_success\)"):
        services.job_delete(job_id=b.pk, by=SYSTEM)
    with pytest.raises(JobValidationError) as caught:
        services.job_update(
            job_id=b.pk, expected_version=b.version, changes={"name": "b2"}, by=SYSTEM
        )
    assert list(caught.value.errors) == ["name"]


@pytest.mark.django_db
def test_the_api_answers_400_naming_the_field_and_the_cycle(admin_api):
    body = {"name": "a", "task": "noop", "schedule_type": "interval", "interval_seconds": 60}
    a = admin_api.post("/api/jobs/", body, format="json").data
    admin_api.post("/api/jobs/", {**body, "name": "b", "on_end": ["a"]}, format="json")
    response = admin_api.patch(
        f"/api/jobs/{a['id']}/", {"version": a["version"], "on_success": ["b"]}, format="json"
    )
    assert response.status_code == 400
    assert "a → b → a" in str(response.data)
    assert "on_success" in str(response.data)


# --- jobs apply -----------------------------------------------------------------------------------


def apply(tmp_path, definitions, *args):
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump(definitions))
    out = StringIO()
    call_command("jobs", "apply", *args, str(path), stdout=out, stderr=StringIO())
    return out.getvalue()


def definition(name, **fields):
    return {
        "name": name,
        "task": "noop",
        "schedule_type": "interval",
        "interval_seconds": 60,
        **fields,
    }


@pytest.mark.django_db
def test_apply_creates_a_chain_to_a_job_defined_later_in_the_file(tmp_path):
    make("existing")
    apply(tmp_path, [definition("existing", on_failure=["zz-new"]), definition("zz-new")])
    assert Job.objects.get(name="existing").on_failure == ["zz-new"]


@pytest.mark.django_db
def test_apply_checks_cycles_across_the_file_and_exits_2(tmp_path):
    with pytest.raises(CommandError) as caught:
        apply(tmp_path, [definition("a", on_success=["b"]), definition("b", on_end=["a"])])
    assert caught.value.returncode == EXIT_USAGE
    assert "a → b → a" in str(caught.value)
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_apply_may_reverse_a_chain_in_one_file(tmp_path):
    """B -> A added while A -> B is dropped: no state of the file has a cycle, whatever order
    its jobs are written in."""
    apply(tmp_path, [definition("a", on_success=["b"]), definition("b")])
    # (A field the file leaves out keeps its stored value, as for every field: [] drops it.)
    apply(tmp_path, [definition("a", on_success=[]), definition("b", on_success=["a"])])
    assert Job.objects.get(name="a").on_success == []
    assert Job.objects.get(name="b").on_success == ["a"]


@pytest.mark.django_db
def test_apply_prune_deletes_a_job_with_its_referrers_but_not_from_under_one(tmp_path):
    apply(tmp_path, [definition("a", on_success=["b"]), definition("b"), definition("c")])
    with pytest.raises(CommandError, match=r"a \(on_success\)"):
        apply(tmp_path, [definition("a", on_success=["b"]), definition("c")], "--prune")
    apply(tmp_path, [definition("c")], "--prune")
    assert list(Job.objects.values_list("name", flat=True)) == ["c"]


@pytest.mark.django_db
def test_export_carries_the_chains(tmp_path):
    make("b")
    make("a", on_success=["b"], on_end=["b"])
    out = StringIO()
    call_command("jobs", "export", stdout=out)
    exported = {d["name"]: d for d in yaml.safe_load(out.getvalue())["jobs"]}
    assert exported["a"]["on_success"] == ["b"]
    assert exported["a"]["on_end"] == ["b"]
    assert exported["b"]["on_failure"] == []


# --- the runs a final outcome makes ---------------------------------------------------------------


def running(job, *, attempt=1, token="tok"):
    now = timezone.now()
    execution = JobExecution.objects.create(
        job=job,
        scheduled_for=now - timedelta(seconds=attempt),
        run_after=now,
        attempt=attempt,
        status=S.RUNNING,
        claim_token=f"{token}-{attempt}",
        started_at=now,
    )
    return JobExecution.objects.select_related("job").get(pk=execution.pk)


def chained(parent):
    return list(JobExecution.objects.filter(parent=parent).order_by("job__name"))


@pytest.mark.django_db
def test_success_runs_on_success_and_on_end_once_each_linked_both_ways():
    make("b")
    make("c")
    a = make("a", on_success=["b"], on_failure=["c"], on_end=["b"])
    parent = running(a)
    won = executions.finish_batch([(parent, {"status": S.SUCCEEDED})], now=timezone.now())
    assert won == {parent.pk}
    runs = chained(parent)
    assert [(r.job.name, r.trigger, r.status, r.attempt) for r in runs] == [
        ("b", Trigger.CHAIN, S.PENDING, 1)
    ]
    assert list(parent.chained_runs.all()) == runs


@pytest.mark.django_db
def test_an_outcome_written_twice_makes_its_chained_run_once():
    """A finisher's batch written again after a commit it did not hear of: the second write finds
    its rows already carrying its outcome, counts them as its own, and makes no second run."""
    make("b")
    parent = running(make("a", on_end=["b"]))
    now = timezone.now()
    outcome = {"status": S.FAILED, "error": "boom", "ended": now.timestamp()}
    assert executions.finish_batch([(parent, outcome)], now=now) == {parent.pk}
    assert executions.finish_batch([(parent, outcome)], now=now) == {parent.pk}
    assert len(chained(parent)) == 1


@pytest.mark.django_db
def test_the_database_refuses_a_second_chained_run_of_one_outcome():
    b = make("b")
    parent = running(make("a", on_end=["b"]))
    executions.finish(parent, status=S.SUCCEEDED, now=timezone.now())
    with pytest.raises(IntegrityError), transaction.atomic():
        JobExecution.objects.create(
            job=b, parent=parent, scheduled_for=timezone.now(), run_after=timezone.now()
        )


@pytest.mark.django_db
def test_a_failure_that_will_be_retried_chains_nothing_until_the_last_attempt():
    make("c")
    a = make("a", on_failure=["c"], max_retries=1)
    first = running(a, attempt=1)
    executions.finish(first, status=S.FAILED, now=timezone.now())
    assert chained(first) == []
    assert JobExecution.objects.filter(job=a, attempt=2, status=S.RETRY_SCHEDULED).exists()
    last = running(a, attempt=2, token="other")
    executions.finish(last, status=S.TIMED_OUT, now=timezone.now())
    assert [r.job.name for r in chained(last)] == ["c"]


@pytest.mark.django_db
def test_a_lost_run_fires_on_failure():
    make("c")
    parent = running(make("a", on_failure=["c"]))
    assert executions.declare_lost(parent, reason="node died", now=timezone.now())
    assert [r.job.name for r in chained(parent)] == ["c"]


@pytest.mark.django_db
def test_a_paused_target_leaves_a_skipped_row_with_its_reason():
    b = make("b", enabled=False)
    parent = running(make("a", on_success=["b"]))
    executions.finish(parent, status=S.SUCCEEDED, now=timezone.now())
    (run,) = chained(parent)
    assert (run.job_id, run.status, run.reason) == (b.pk, S.SKIPPED, chains.REASON_TARGET_DISABLED)
    assert run.finished_at is not None


@pytest.mark.django_db
def test_a_cancelled_run_chains_nothing():
    make("b")
    parent = running(make("a", on_end=["b"]))
    executions.finish(parent, status=S.CANCELLED, now=timezone.now())
    assert chained(parent) == []


@pytest.mark.django_db
def test_outcomes_of_one_batch_chaining_to_one_job_get_a_slot_each():
    make("b")
    a, c = make("a", on_success=["b"]), make("c", on_success=["b"])
    first, second = running(a), running(c, token="c")
    now = timezone.now()
    executions.finish_batch(
        [(first, {"status": S.SUCCEEDED}), (second, {"status": S.SUCCEEDED})], now=now
    )
    runs = JobExecution.objects.filter(trigger=Trigger.CHAIN)
    assert sorted(runs.values_list("parent_id", flat=True)) == sorted([first.pk, second.pk])
    assert len(set(runs.values_list("scheduled_for", flat=True))) == 2


@pytest.mark.django_db
def test_the_run_detail_links_parent_and_chained_runs(admin_api):
    make("b")
    parent = running(make("a", on_success=["b"]))
    executions.finish(parent, status=S.SUCCEEDED, now=timezone.now())
    (child,) = chained(parent)
    detail = admin_api.get(f"/api/executions/{parent.pk}/").data
    assert (detail["parent"], detail["chained_runs"]) == (None, [child.pk])
    detail = admin_api.get(f"/api/executions/{child.pk}/").data
    assert (detail["parent"], detail["chained_runs"], detail["trigger"]) == (parent.pk, [], "chain")
    listed = admin_api.get("/api/executions/", {"job": child.job_id}).data["results"]
    assert listed[0]["parent"] == parent.pk


@pytest.mark.django_db
def test_the_dashboard_shows_the_chain_both_ways(client, make_user):
    client.force_login(make_user("viewer", "viewer-chains"))
    b = make("b")
    a = make("a", on_success=["b"])
    parent = running(a)
    executions.finish(parent, status=S.SUCCEEDED, now=timezone.now())
    (child,) = chained(parent)
    page = client.get(reverse("dashboard:execution-detail", args=[parent.pk])).content.decode()
    assert "Triggered runs" in page and f"run #{child.pk}</a> of b" in page
    page = client.get(reverse("dashboard:execution-detail", args=[child.pk])).content.decode()
    assert f"run #{parent.pk}</a> of a" in page
    page = client.get(reverse("dashboard:job-detail", args=[a.pk])).content.decode()
    assert reverse("dashboard:job-detail", args=[b.pk]) in page
