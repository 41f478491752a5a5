"""Operator CLI: ``jobs`` (list, trigger, pause, resume, export, apply), ``bootstrap_admin`` and
``createuser``."""

from __future__ import annotations

import hashlib
import json
import re
import stat
from datetime import timedelta
from io import StringIO

import pytest
import yaml
from django.contrib.auth import authenticate as django_authenticate
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import RequestFactory
from django.utils import timezone
from rest_framework.test import APIClient

from jobs import selectors
from jobs.management.commands.jobs import EXIT_USAGE
from jobs.models import ApiToken, AuditEvent, Job, JobExecution
from jobs.services import Actor, job_create

CLI = Actor(source="cli")


def authenticate(**credentials: str) -> object:
    """Credentials checked as a login checks them: with a request (the login throttle needs one)."""
    return django_authenticate(RequestFactory().post("/login/"), **credentials)


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def run(*args: str) -> str:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue()


def state() -> tuple:
    return (
        list(Job.objects.order_by("pk").values()),
        list(JobExecution.objects.order_by("pk").values()),
        list(AuditEvent.objects.values_list("pk", flat=True)),
    )


@pytest.fixture
def jobs(db):
    run_at = (timezone.now() + timedelta(days=3)).replace(microsecond=0)
    return [
        job_create(
            data={
                "name": "nightly-report",
                "description": "Sends the report",
                "task": "log",
                "args": ["report"],
                "kwargs": {"level": "warning"},
                "schedule_type": "cron",
                "cron_expression": "30 2 * * *",
                "timezone": "Europe/Berlin",
                "max_retries": 3,
                "retry_backoff_factor": 3.0,
                "timeout_seconds": 120,
                "priority": 5,
                "queue": "reports",
                "misfire_policy": "skip",
                "concurrency_policy": "replace",
            },
            by=CLI,
        ),
        job_create(
            data={
                "name": "poll",
                "task": "sleep",
                "args": [0.1],
                "schedule_type": "interval",
                "interval_seconds": 90,
                "start_at": "2030-01-01T00:00:15+00:00",
                "spread_seconds": 10,
                "enabled": False,
            },
            by=CLI,
        ),
        job_create(
            data={"name": "one-off", "task": "noop", "schedule_type": "once", "run_at": run_at},
            by=CLI,
        ),
    ]


# --- list / trigger / pause / resume -------------------------------------------------------------


def test_list(jobs):
    output = run("jobs", "list")
    lines = output.strip().splitlines()
    assert lines[0].split()[:4] == ["NAME", "TASK", "SCHEDULE", "ENABLED"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == {"nightly-report", "poll", "one-off"}
    assert "30 2 * * *" in rows["nightly-report"]
    assert "every 90s" in rows["poll"]
    assert " no " in rows["poll"]
    assert rows["poll"].rstrip().endswith("-")  # paused: no next fire
    assert "once " in rows["one-off"]


def test_list_json(jobs):
    data = json.loads(run("jobs", "list", "--json"))
    assert [d["name"] for d in data] == ["nightly-report", "one-off", "poll"]
    assert data[0]["cron_expression"] == "30 2 * * *"


def test_list_of_no_jobs(db):
    assert run("jobs", "list").strip().startswith("NAME")


def test_enqueue_runs_with_their_own_arguments(jobs):
    job = jobs[1]  # "sleep", paused: enqueued runs are accepted anyway
    output = run("jobs", "enqueue", job.name, "--args", "[0.5]", "--priority", "3", "--count", "3")
    runs = list(JobExecution.objects.filter(job=job).order_by("pk"))
    assert output.strip() == f"enqueued 3 run(s) of poll: {', '.join(str(r.pk) for r in runs)}"
    assert [(r.args, r.kwargs, r.priority, r.trigger) for r in runs] == [
        ([0.5], None, 3, "enqueue")
    ] * 3
    event = AuditEvent.objects.get(action="job.enqueue")
    assert (event.source, event.changes) == ("cli", {"runs": [None, 3]})


def test_enqueue_from_a_file_of_runs(jobs, tmp_path):
    runs_file = tmp_path / "runs.yaml"
    later = (timezone.now() + timedelta(hours=1)).replace(microsecond=0)
    runs_file.write_text(
        yaml.safe_dump({"runs": [{"args": [1]}, {"args": [2], "run_at": later.isoformat()}]})
    )
    run("jobs", "enqueue", "poll", "--file", str(runs_file))
    runs = list(JobExecution.objects.filter(job=jobs[1]).order_by("pk"))
    assert [r.args for r in runs] == [[1], [2]]
    assert runs[1].run_after.replace(microsecond=0) == later


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--kwargs", "{oops"], "--kwargs is not JSON"),
        (["--count", "0"], "--count must be within 1-5000"),
        (["--args", '["a", "b"]'], "invalid run(s), nothing written:\n  0.args: "),
        (["--run-at", "soon"], "0.run_at"),
        (["--file", "runs.json", "--count", "2"], "--file gives every run"),
    ],
)
def test_enqueue_refuses_bad_input_with_exit_2_and_writes_nothing(jobs, argv, needle):
    before = state()
    with pytest.raises(CommandError) as raised:
        run("jobs", "enqueue", "poll", *argv)
    assert raised.value.returncode == EXIT_USAGE
    assert needle in str(raised.value)
    assert state() == before


@pytest.mark.parametrize("ref", ["name", "id"])
def test_trigger(jobs, ref):
    job = jobs[1]  # paused: a manual run works anyway
    output = run("jobs", "trigger", job.name if ref == "name" else str(job.pk))
    execution = JobExecution.objects.get(job=job)
    assert output.strip() == f"triggered {job.name}: execution {execution.pk}"
    assert (execution.status, execution.trigger, execution.triggered_by) == (
        "pending",
        "manual",
        None,
    )
    event = AuditEvent.objects.get(action="job.trigger")
    assert (event.source, event.actor_name, event.actor) == ("cli", "cli", None)


def test_pause_and_resume(jobs):
    job = jobs[0]
    assert run("jobs", "pause", job.name).strip() == f"paused {job.name}"
    job.refresh_from_db()
    assert (job.enabled, job.next_fire_at) == (False, None)
    output = run("jobs", "resume", job.name)
    job.refresh_from_db()
    assert job.enabled is True and job.next_fire_at is not None
    assert output.startswith(f"resumed {job.name}; next fire ")
    assert list(
        AuditEvent.objects.filter(source="cli", action__in=["job.pause", "job.resume"])
        .order_by("pk")
        .values_list("action", flat=True)
    ) == ["job.pause", "job.resume"]


@pytest.mark.parametrize("action", ["trigger", "pause", "resume"])
def test_unknown_job_name_is_exit_2(jobs, action):
    before = state()
    with pytest.raises(CommandError) as info:
        run("jobs", action, "no-such-job")
    assert info.value.returncode == EXIT_USAGE == 2
    assert "no-such-job" in str(info.value)
    assert state() == before


def test_export_unknown_name_is_exit_2(jobs):
    with pytest.raises(CommandError) as info:
        run("jobs", "export", "poll", "no-such-job")
    assert info.value.returncode == 2
    assert "no-such-job" in str(info.value)


# --- export and apply ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_export_then_apply_to_an_empty_database_recreates_identical_jobs(jobs, tmp_path, fmt):
    exported = selectors.job_definitions_export()
    path = tmp_path / f"jobs.{fmt}"
    run("jobs", "export", "--format", fmt, "--output", str(path))
    text = path.read_text()
    parsed = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    assert [d["name"] for d in parsed["jobs"]] == ["nightly-report", "one-off", "poll"]

    next_fires = {j.name: Job.objects.get(pk=j.pk).next_fire_at for j in jobs}
    Job.objects.all().delete()
    AuditEvent.objects.all().delete()

    output = run("jobs", "apply", str(path))
    assert "3 created" in output
    assert selectors.job_definitions_export() == exported
    for name, next_fire in next_fires.items():
        assert Job.objects.get(name=name).next_fire_at == next_fire, name
    assert AuditEvent.objects.filter(action="job.create", source="cli").count() == 3

    again = run("jobs", "apply", str(path))
    assert "0 created, 0 updated, 3 unchanged, 0 deleted" in again
    for name in ("nightly-report", "one-off", "poll"):
        assert re.search(rf"^unchanged\s+{re.escape(name)}$", again, re.M), again


def test_export_then_apply_with_a_fired_one_off_job(jobs, tmp_path):
    fired = timezone.now() - timedelta(days=1)
    Job.objects.filter(name="one-off").update(run_at=fired, last_fire_at=fired, next_fire_at=None)
    path = tmp_path / "jobs.yaml"
    run("jobs", "export", "--output", str(path))
    Job.objects.all().delete()
    run("jobs", "apply", str(path))
    assert Job.objects.count() == 3
    assert Job.objects.get(name="one-off").next_fire_at is None  # and it does not fire again


def test_export_to_stdout_selected_names(jobs):
    data = yaml.safe_load(run("jobs", "export", "poll"))
    assert [d["name"] for d in data["jobs"]] == ["poll"]
    assert data["jobs"][0]["start_at"] == "2030-01-01T00:00:15+00:00"


def test_apply_dry_run_prints_and_writes_nothing(jobs, tmp_path):
    path = tmp_path / "jobs.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "jobs": [
                    {"name": "poll", "interval_seconds": 120},
                    {
                        "name": "fresh",
                        "task": "noop",
                        "schedule_type": "interval",
                        "interval_seconds": 5,
                    },
                ]
            }
        )
    )
    before = state()
    output = run("jobs", "apply", "--dry-run", "--prune", str(path))
    assert state() == before
    lines = output.strip().splitlines()
    assert all(line.startswith("(dry run)") for line in lines if not line.startswith("    "))
    assert re.search(r"^\(dry run\) updated\s+poll$", output, re.M)
    assert "    interval_seconds: 90 -> 120" in output
    assert re.search(r"^\(dry run\) created\s+fresh$", output, re.M)
    assert re.search(r"^\(dry run\) deleted\s+nightly-report$", output, re.M)
    assert lines[-1] == "(dry run) 1 created, 1 updated, 0 unchanged, 2 deleted"


def test_apply_updates_and_reports_the_diff(jobs, tmp_path):
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps([{"name": "poll", "interval_seconds": 120}]))
    output = run("jobs", "apply", str(path))
    assert re.search(r"^updated\s+poll$", output, re.M)
    assert "interval_seconds: 90 -> 120" in output
    assert Job.objects.get(name="poll").interval_seconds == 120
    assert "unchanged" in run("jobs", "apply", str(path))


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (
            "jobs: [{name: bad, task: noop, schedule_type: cron, cron_expression: '61 * * * *'}]",
            "bad.cron_expression",
        ),
        (
            "[{name: ok, task: noop, schedule_type: interval, interval_seconds: 5},"
            " {name: bad, task: nope, schedule_type: interval, interval_seconds: 5}]",
            "bad.task",
        ),
        (
            "[{name: twice, task: noop, schedule_type: interval, interval_seconds: 5},"
            " {name: twice, task: noop, schedule_type: interval, interval_seconds: 6}]",
            "twice.name",
        ),
        ("[42]", "#0"),
        ("{not: a list}", "expected a list"),
        ("jobs: [unclosed", "not valid YAML"),
        ("!!python/object/apply:os.system ['echo pwned']", "not valid YAML"),
        ("", "expected a list"),
    ],
    ids=[
        "bad-cron",
        "unknown-task",
        "duplicate",
        "not-an-object",
        "not-a-list",
        "broken-yaml",
        "unsafe-yaml",
        "empty",
    ],
)
def test_invalid_file_is_exit_2_and_writes_nothing(jobs, tmp_path, content, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    before = state()
    with pytest.raises(CommandError) as info:
        run("jobs", "apply", str(path))
    assert info.value.returncode == 2
    assert needle in str(info.value)
    assert state() == before


def test_missing_file_is_exit_2(db, tmp_path):
    with pytest.raises(CommandError) as info:
        run("jobs", "apply", str(tmp_path / "missing.yaml"))
    assert info.value.returncode == 2


# --- bootstrap_admin -----------------------------------------------------------------------------


PASSWORD_RE = re.compile(r"with password: (\S+)")


def test_bootstrap_admin_creates_one_superuser_with_a_random_password(db, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    output = run("bootstrap_admin")
    match = PASSWORD_RE.search(output)
    assert match, output
    password = match.group(1)
    assert len(password) >= 16
    user = authenticate(username="admin", password=password)
    assert user is not None and user.is_superuser and user.is_staff
    saved = tmp_path / "admin_password"
    assert saved.read_text().strip() == password
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600

    again = run("bootstrap_admin")
    assert "already exists" in again
    assert password not in again
    assert get_user_model().objects.filter(is_superuser=True).count() == 1
    assert authenticate(username="admin", password=password) is not None


def test_bootstrap_admin_passwords_differ_between_installations(db, settings, tmp_path):
    passwords = []
    for index in range(2):
        settings.VAR_DIR = tmp_path / str(index)
        get_user_model().objects.all().delete()  # a fresh database
        passwords.append(PASSWORD_RE.search(run("bootstrap_admin")).group(1))
    assert passwords[0] != passwords[1]


def test_bootstrap_admin_does_nothing_when_a_superuser_exists(db, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    get_user_model().objects.create_superuser("root", "", "x-Long-password-1")
    assert "already exists" in run("bootstrap_admin")
    assert not get_user_model().objects.filter(username="admin").exists()
    assert not (tmp_path / "admin_password").exists()


# --- createuser ----------------------------------------------------------------------------------


def test_createuser_operator_token_has_operator_rights(jobs):
    output = run("createuser", "ops", "--role", "operator", "--token")
    token = re.search(r"API token: (\S+)", output).group(1)
    password = re.search(r"password: (\S+)", output).group(1)
    assert authenticate(username="ops", password=password) is not None

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/jobs/").status_code == 200
    assert client.post(f"/api/jobs/{jobs[0].pk}/trigger/").status_code == 201
    assert client.post(f"/api/jobs/{jobs[0].pk}/pause/").status_code == 200
    before = state()
    created = client.post(
        "/api/jobs/",
        {"name": "x", "task": "noop", "schedule_type": "interval", "interval_seconds": 5},
        format="json",
    )
    assert created.status_code == 403
    assert client.delete(f"/api/jobs/{jobs[0].pk}/").status_code == 403
    assert state() == before


def test_createuser_changes_role_and_keeps_one_token(db):
    first = run("createuser", "sam", "--role", "viewer", "--token", "--password", "Pw-one-1234")
    token = re.search(r"API token: (\S+)", first).group(1)
    second = run(
        "createuser", "sam", "--role", "admin", "--token", "--password", "Pw-two-1234", "--update"
    )
    assert second.startswith("updated sam (admin)")
    # Keys are stored hashed: the one the user has is kept, not shown again.
    assert f"API token: kept ({token[:8]}…)" in second
    assert token not in second
    user = get_user_model().objects.get(username="sam")
    assert sorted(user.groups.values_list("name", flat=True)) == ["admin"]
    assert authenticate(username="sam", password="Pw-two-1234") is not None

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    response = client.post(
        "/api/jobs/",
        {"name": "by-sam", "task": "noop", "schedule_type": "interval", "interval_seconds": 5},
        format="json",
    )
    assert response.status_code == 201


def test_createuser_refuses_an_unknown_role(db):
    with pytest.raises(CommandError):
        run("createuser", "eve", "--role", "root")
    assert not get_user_model().objects.filter(username="eve").exists()


def test_createuser_refuses_a_weak_password_with_exit_2(db):
    with pytest.raises(CommandError) as raised:
        run("createuser", "weak", "--role", "viewer", "--password", "1")
    assert raised.value.returncode == 2
    assert str(raised.value).startswith("password: ")
    assert not get_user_model().objects.filter(username="weak").exists()
    assert not AuditEvent.objects.filter(object_type="user").exists()


def test_createuser_refuses_a_bad_username_with_exit_2(db):
    with pytest.raises(CommandError) as raised:
        run("createuser", "no spaces/here", "--role", "viewer")
    assert raised.value.returncode == 2
    assert not get_user_model().objects.exists()


def test_createuser_changes_are_audited_without_secrets(db):
    first = run("createuser", "kim", "--role", "viewer", "--token", "--password", "Pw-kim-12345")
    run(
        "createuser",
        "kim",
        "--role",
        "operator",
        "--token",
        "--password",
        "Pw-kim-67890",
        "--update",
    )
    token = re.search(r"API token: (\S+)", first).group(1)
    expires = ApiToken.objects.get(user__username="kim").expires_at.isoformat(timespec="seconds")
    events = list(
        AuditEvent.objects.filter(object_type="user")
        .order_by("id")
        .values_list("action", "actor_name", "source", "object_repr", "changes")
    )
    assert events == [
        (
            "user.create",
            "cli",
            "cli",
            "kim",
            {"role": [None, "viewer"], "password": [None, "(set)"]},
        ),
        (
            "token.create",
            "cli",
            "cli",
            "kim",
            {"token": [None, f"{token[:8]}…"], "expires_at": [None, expires]},
        ),
        (
            "user.update",
            "cli",
            "cli",
            "kim",
            {"role": ["viewer", "operator"], "password": [None, "(set)"]},
        ),
    ]
    logged = json.dumps(list(AuditEvent.objects.values()), default=str)
    for secret in ("Pw-kim-12345", "Pw-kim-67890", token):
        assert secret not in logged


def test_createuser_never_changes_an_existing_user_without_update(db):
    run("createuser", "lee", "--role", "viewer", "--password", "Pw-lee-12345")
    with pytest.raises(CommandError) as raised:
        run("createuser", "lee", "--role", "admin", "--password", "Pw-lee-67890")
    assert raised.value.returncode == 2
    assert "--update" in str(raised.value)
    assert authenticate(username="lee", password="Pw-lee-12345") is not None
    user = get_user_model().objects.get(username="lee")
    assert list(user.groups.values_list("name", flat=True)) == ["viewer"]


def test_createuser_update_without_a_password_option_keeps_the_password(db):
    """Changing a role must not lock the user out: --update alone left a new random password."""
    run("createuser", "rob", "--role", "viewer", "--password", "Pw-rob-12345")
    hashed = get_user_model().objects.get(username="rob").password
    output = run("createuser", "rob", "--role", "admin", "--update")
    assert output.strip() == "updated rob (admin); password: unchanged"
    user = get_user_model().objects.get(username="rob")
    assert user.password == hashed
    assert authenticate(username="rob", password="Pw-rob-12345") is not None
    assert sorted(user.groups.values_list("name", flat=True)) == ["admin"]
    update = AuditEvent.objects.get(action="user.update")
    assert update.changes == {"role": ["viewer", "admin"]}


def test_createuser_update_with_reset_password_sets_and_prints_a_new_one(db):
    run("createuser", "ria", "--role", "viewer", "--password", "Pw-ria-12345")
    output = run("createuser", "ria", "--role", "viewer", "--update", "--reset-password")
    password = re.search(r"password: (\S+)", output).group(1)
    assert password != "unchanged"
    assert authenticate(username="ria", password="Pw-ria-12345") is None
    assert authenticate(username="ria", password=password) is not None
    assert AuditEvent.objects.get(action="user.update").changes == {"password": [None, "(set)"]}
    with pytest.raises(CommandError) as raised:
        run(
            "createuser",
            "ria",
            "--role",
            "viewer",
            "--update",
            "--reset-password",
            "--password",
            "Pw-x-123456",
        )
    assert raised.value.returncode == 2


# --- tokens --------------------------------------------------------------------------------------


def issued_key(output: str) -> str:
    return re.search(r"API token for \S+: (\S+)", output).group(1)


def test_tokens_issue_rotate_list_and_revoke_are_audited(db):
    run("createuser", "tia", "--role", "operator", "--password", "Pw-tia-12345")
    first = issued_key(run("tokens", "issue", "tia", "--name", "ci"))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {first}")
    assert client.get("/api/jobs/").status_code == 200

    # A second key beside the first (move the clients, then revoke the old one).
    second = issued_key(run("tokens", "issue", "tia"))
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Token {second}")
    assert client.get("/api/jobs/").status_code == 200
    assert other.get("/api/jobs/").status_code == 200
    run("tokens", "revoke", "tia", "--prefix", first[:8])
    assert client.get("/api/jobs/").status_code == 401  # the old key no longer works
    assert other.get("/api/jobs/").status_code == 200

    third = issued_key(run("tokens", "issue", "tia", "--rotate"))
    assert other.get("/api/jobs/").status_code == 401  # --rotate revoked the others
    listed = run("tokens", "list")
    assert listed.startswith(f"tia\t{third[:8]}…\t-\tcreated ")
    assert third not in listed and "valid" in listed

    run("tokens", "revoke", "tia")
    assert not ApiToken.objects.filter(user__username="tia").exists()
    actions = list(
        AuditEvent.objects.filter(object_type="user", action__startswith="token.")
        .order_by("id")
        .values_list("action", "source")
    )
    assert actions == [
        ("token.create", "cli"),
        ("token.create", "cli"),
        ("token.revoke", "cli"),
        ("token.revoke", "cli"),
        ("token.rotate", "cli"),
        ("token.revoke", "cli"),
    ]
    logged = json.dumps(list(AuditEvent.objects.values()), default=str)
    for key in (first, second, third):
        assert key not in logged


def test_keys_are_stored_as_digests_and_expire(db, settings):
    """Nothing in the database is a usable key; a key past its expiry is a 401 saying so; a
    lifetime is chosen at issue (--days, --no-expiry) or by SCHEDULER_TOKEN_TTL_DAYS."""
    run("createuser", "uma", "--role", "viewer", "--password", "Pw-uma-12345")
    key = issued_key(run("tokens", "issue", "uma", "--days", "2"))
    stored = json.dumps(list(ApiToken.objects.values()), default=str)
    assert key not in stored
    token = ApiToken.objects.get(user__username="uma")
    assert token.digest == hashlib.sha256(key.encode()).hexdigest()
    assert abs((token.expires_at - timezone.now()) - timedelta(days=2)) < timedelta(minutes=1)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/jobs/").status_code == 200
    assert ApiToken.objects.get(pk=token.pk).last_used_at is not None

    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = client.get("/api/jobs/")
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]

    never = issued_key(run("tokens", "issue", "uma", "--no-expiry"))
    assert ApiToken.objects.get(prefix=never[:8]).expires_at is None
    settings.SCHEDULER_TOKEN_TTL_DAYS = 7
    week = issued_key(run("tokens", "issue", "uma"))
    expires = ApiToken.objects.get(prefix=week[:8]).expires_at
    assert abs((expires - timezone.now()) - timedelta(days=7)) < timedelta(minutes=1)
    with pytest.raises(CommandError) as raised:
        run("tokens", "issue", "uma", "--days", "0")
    assert raised.value.returncode == 2


def test_the_migration_hashes_the_clear_keys_it_finds(db):
    """A key REST framework stored in clear before the upgrade keeps working, stored hashed."""
    import importlib

    from django.apps import apps
    from rest_framework.authtoken.models import Token

    run("createuser", "old", "--role", "viewer", "--password", "Pw-old-12345")
    clear = Token.objects.create(user=get_user_model().objects.get(username="old")).key
    migration = importlib.import_module("jobs.migrations.0005_api_tokens")
    migration.move_clear_keys(apps, None)
    assert not Token.objects.exists()
    token = ApiToken.objects.get(user__username="old")
    assert token.digest == hashlib.sha256(clear.encode()).hexdigest() and clear not in token.digest
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {clear}")
    assert client.get("/api/jobs/").status_code == 200


@pytest.mark.parametrize(
    "args", [("issue", "nobody"), ("revoke", "nobody")], ids=["issue", "revoke"]
)
def test_tokens_for_an_unknown_user_exit_2(db, args):
    with pytest.raises(CommandError) as raised:
        run("tokens", *args)
    assert raised.value.returncode == 2
    assert "nobody" in str(raised.value)


def test_keys_never_start_with_a_dash():
    """Their prefix is typed after --prefix, where a leading dash reads as another option (one
    random key in 64 started with one, and revoking it by prefix failed)."""
    from jobs import tokens

    assert not any(tokens.new_key().startswith("-") for _ in range(2000))


def test_a_key_is_revoked_by_a_prefix_of_at_least_four_characters(db):
    run("createuser", "rex", "--role", "viewer", "--password", "Pw-rex-12345")
    key = issued_key(run("tokens", "issue", "rex"))
    for bad in ("", "abc"):
        with pytest.raises(CommandError) as raised:
            run("tokens", "revoke", "rex", "--prefix", bad)
        assert raised.value.returncode == 2 and "--prefix" in str(raised.value)
    assert ApiToken.objects.filter(user__username="rex").count() == 1
    run("tokens", "revoke", "rex", "--prefix", key[:5])
    assert not ApiToken.objects.filter(user__username="rex").exists()


def test_createuser_token_replaces_a_key_that_has_expired(db):
    first = run("createuser", "eve", "--role", "viewer", "--token", "--password", "Pw-eve-12345")
    old = re.search(r"API token: (\S+)", first).group(1)
    ApiToken.objects.filter(user__username="eve").update(
        expires_at=timezone.now() - timedelta(days=1)
    )
    again = run(
        "createuser", "eve", "--role", "viewer", "--token", "--password", "Pw-eve-67890", "--update"
    )
    new = re.search(r"API token: (\S+)", again).group(1)
    assert new != old and "kept" not in again
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {new}")
    assert client.get("/api/jobs/").status_code == 200
