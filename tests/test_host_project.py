"""The package a Django shop installs: this repository builds into a wheel of the three apps (with
their templates, files and migrations, and nothing of this repository's own project), and a host
project of its own (tests/hostproject: its own settings, its own app and model) migrates, passes
Django's checks and finds its own task with only that wheel installed, from outside this
checkout."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
HOST = Path(__file__).resolve().parent / "hostproject"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    work = tmp_path_factory.mktemp("source")
    # Built from a copy: a build writes build/ and *.egg-info beside the sources.
    source = work / "src"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", "var", "staticfiles", "node_modules", "__pycache__", "tests"
        ),
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("*.whl")
    return built


def test_the_wheel_holds_the_apps_with_their_templates_files_and_migrations(wheel: Path):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"jobs", "cluster", "dashboard", "chaos"}
    assert "dashboard/templates/dashboard/base.html" in names
    assert "dashboard/templates/registration/login.html" in names
    assert "dashboard/static/dashboard/css/dashboard.css" in names
    assert "jobs/migrations/0001_initial.py" in names
    assert any(name.startswith("cluster/migrations/0001") for name in names)
    assert "chaos/clockshim.c" in names  # the chaos command compiles it
    for name in names:
        if name.endswith(".py"):
            text = zipfile.ZipFile(wheel).read(name).decode()
            assert "import scheduler_project" not in text, name
            assert "from scheduler_project" not in text, name


def test_a_host_project_migrates_checks_and_finds_its_own_task(wheel: Path, tmp_path: Path):
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), wheel],
        check=True,
        capture_output=True,
        timeout=300,
    )
    project = tmp_path / "project"
    shutil.copytree(HOST, project, ignore=shutil.ignore_patterns("__pycache__"))
    # Only the installed wheel and the host's own code: not this checkout (the interpreter's own
    # packages give Django and the other requirements).
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_"))},
        "PYTHONPATH": str(site),
        "HOST_DB": str(tmp_path / "shop.sqlite3"),
    }

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    where = manage(
        "shell", "-c", "import jobs, dashboard; print(jobs.__file__, dashboard.__file__)"
    )
    assert where.returncode == 0, where.stderr
    assert str(site) in where.stdout and str(ROOT) not in where.stdout
    migrated = manage("migrate", "--noinput", "-v", "0")
    assert migrated.returncode == 0, migrated.stderr
    checked = manage("check")
    assert checked.returncode == 0, checked.stderr
    pages = manage(
        "shell",
        "-c",
        "import json\n"
        "from django.contrib.auth import get_user_model\n"
        "from django.test import Client\n"
        "anonymous = Client()\n"
        "admin = Client()\n"
        "admin.force_login(get_user_model().objects.create_superuser('ops', 'o@shop.test', 'x'))\n"
        "home = admin.get('/ops/scheduler/')\n"
        "print(json.dumps({'home': home.status_code, 'body': home.content.decode(),\n"
        "  'jobs': admin.get('/ops/scheduler/jobs/').status_code,\n"
        "  'api': admin.get('/ops/scheduler/api/jobs/').status_code,\n"
        "  'anonymous_api': anonymous.get('/ops/scheduler/api/jobs/').status_code,\n"
        "  'anonymous_page': anonymous.get('/ops/scheduler/jobs/').status_code}))",
    )
    assert pages.returncode == 0, pages.stderr
    seen = json.loads(pages.stdout.strip().splitlines()[-1])
    assert (seen["home"], seen["jobs"], seen["api"]) == (200, 200, 200), seen
    assert seen["anonymous_api"] in (401, 403) and seen["anonymous_page"] == 302
    # The pages' scripts find the dashboard, the API and the sign-in page where the shop put them.
    assert 'data-root="/ops/scheduler/"' in seen["body"]
    assert 'data-api="/ops/scheduler/api/"' in seen["body"]
    assert 'data-login="/accounts/login/"' in seen["body"]
    tasks = manage("jobs", "tasks")
    assert tasks.returncode == 0, tasks.stderr
    assert "shop.count_orders: Record a tally of the shop's orders" in tasks.stdout
    assert "noop" in tasks.stdout  # the built-in tasks come with the package

    # The shop's data, a job of its task, and one node of its own running it.
    made = manage(
        "shell",
        "-c",
        "from shop.models import Order; [Order.objects.create(reference=r) "
        "for r in ('a-1', 'a-2')]",
    )
    assert made.returncode == 0, made.stderr
    (project / "jobs.yaml").write_text(
        "jobs:\n- name: count-orders\n  task: shop.count_orders\n"
        "  schedule_type: interval\n  interval_seconds: 1\n"
    )
    applied = manage("jobs", "apply", "jobs.yaml")
    assert applied.returncode == 0, applied.stderr
    node = subprocess.Popen(
        [sys.executable, "manage.py", "runnode", "--node-id", "shop-1"],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        results: list[object] = []
        while time.monotonic() < deadline and len(results) < 2:
            time.sleep(0.5)
            read = manage(
                "shell",
                "-c",
                "import json; from jobs.models import JobExecution as E; "
                "print(json.dumps([e.result for e in E.objects.filter(status='succeeded')]))",
            )
            assert read.returncode == 0, read.stderr
            results = json.loads(read.stdout.strip().splitlines()[-1])
    finally:
        node.send_signal(signal.SIGTERM)
        output, _ = node.communicate(timeout=60)
    assert node.returncode == 0, output
    assert len(results) >= 2 and set(results) == {2}, output  # the body counted the shop's orders
    tallies = manage(
        "shell",
        "-c",
        "from shop.models import Order; print(Order.objects.filter(reference='tally-2').count())",
    )
    assert int(tallies.stdout.strip().splitlines()[-1]) >= len(results)  # and wrote the shop's own
    # A wrong knob in the shop's SCHEDULER: one line naming it (Django's system check, which
    # runnode runs first: exit 1), no traceback, and `check` fails the same way.
    bad = {**env, "DJANGO_SETTINGS_MODULE": "hostsite.settings_bad"}
    (project / "hostsite" / "settings_bad.py").write_text(
        "from hostsite.settings import *  # noqa: F403\nSCHEDULER = {'CAPACITY': 0}\n"
    )
    refused = subprocess.run(
        [sys.executable, "manage.py", "runnode", "--node-id", "shop-2"],
        cwd=project,
        env=bad,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 1, refused.stderr
    assert "SCHEDULER['CAPACITY']=0: must be at least 1" in refused.stderr
    assert "Traceback" not in refused.stderr
    checked = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=project,
        env=bad,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode != 0 and "cluster.E001" in checked.stderr


def test_the_api_refuses_to_load_on_drfs_own_defaults(settings):
    """A project that includes the API without its DRF settings would serve it open to anyone
    (DRF's default permission is AllowAny): dashboard.api_urls refuses to load instead."""
    import importlib

    from django.core.exceptions import ImproperlyConfigured

    import dashboard.api_urls

    ours = settings.REST_FRAMEWORK
    settings.REST_FRAMEWORK = {}
    try:
        with pytest.raises(ImproperlyConfigured, match=r"jobs\.api\.settings\.rest_framework"):
            importlib.reload(dashboard.api_urls)
    finally:
        settings.REST_FRAMEWORK = ours
        importlib.reload(dashboard.api_urls)
