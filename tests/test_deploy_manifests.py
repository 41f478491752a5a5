"""What the deploy files must hold for a real cluster, checked against the code (no engine, no
cluster needed). docker/image-test.sh builds and runs the image itself; make deploy-lint checks
the files against their schemas (hadolint, the compose spec, Kubernetes' OpenAPI)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from django.urls import reverse

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "docker" / "Dockerfile").read_text()
COMPOSE = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
MANIFESTS = list(yaml.safe_load_all((ROOT / "docker" / "k8s" / "scheduler.yaml").read_text()))
SECRET_LOOKING = re.compile(r"SECRET|TOKEN|PASSWORD|DATABASE_URL")


# --- the image ------------------------------------------------------------------------------------


def _dockerignore_patterns() -> list[re.Pattern[str]]:
    """.dockerignore's patterns as regular expressions over context-relative paths (Docker's
    syntax: * within one part, ** across parts, a leading / is the root; no ! here)."""
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("!"), "exceptions would need a fuller matcher here"
        regex = ""
        for part in re.split(r"(\*\*/|\*\*|\*|\?)", line.lstrip("/")):
            regex += {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(part) or re.sub(
                r"\\\[(.*?)\\\]", r"[\1]", re.escape(part)
            )
        patterns.append(re.compile(regex))
    return patterns


def _ignored(relative: str, patterns: list[re.Pattern[str]]) -> bool:
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(p.fullmatch(prefix) for p in patterns for prefix in prefixes)


def _local_packages() -> list[str]:
    """The project's own packages the settings load (INSTALLED_APPS, the settings' package)."""
    names = {app.split(".")[0] for app in settings.INSTALLED_APPS}
    names.add(settings.SETTINGS_MODULE.split(".")[0])
    return sorted(name for name in names if (ROOT / name / "__init__.py").exists())


def test_the_image_takes_the_whole_project_but_what_dockerignore_leaves_out():
    """The image once lacked the dashboard app (a list of folders to COPY went stale): now it
    copies the project, and no file an installed app, the templates or the static files need is
    ignored."""
    assert re.search(r"^COPY \. \.$", DOCKERFILE, re.M)
    assert "dashboard" in _local_packages()
    patterns = _dockerignore_patterns()
    needed = [ROOT / "manage.py"]
    for folder in [*_local_packages(), *settings.TEMPLATES[0]["DIRS"], *settings.STATICFILES_DIRS]:
        needed += [
            p for p in (ROOT / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts
        ]
    assert len(needed) > 100
    for path in needed:
        relative = path.relative_to(ROOT).as_posix()
        assert not _ignored(relative, patterns), f"{relative} is needed but .dockerignore drops it"
    for local in (".git", ".venv", "var/db.sqlite3", "tests/conftest.py", "jobs/__pycache__/x.pyc"):
        assert _ignored(local, patterns), local


def test_the_image_builds_on_debian_bookworm_slim_with_debians_python():
    first_from = DOCKERFILE.index("\nFROM ")
    assert re.search(r"^ARG BASE=debian:bookworm-slim$", DOCKERFILE[:first_from], re.M)
    froms = re.findall(r"^FROM (\S+)", DOCKERFILE, re.M)
    assert froms == ["${BASE}", "${BASE}"], "both stages on the same base (a local one for CI)"
    for stage in re.split(r"^FROM ", DOCKERFILE, flags=re.M)[1:]:
        assert re.search(r"apt-get install [^\n]*\bpython3\b", stage)
    # The secret key at build time is a throwaway, and none is baked into the image.
    assert not re.search(r"^ENV[^\n]*DJANGO_SECRET_KEY", DOCKERFILE, re.M)


def _image_user() -> int:
    return int(re.findall(r"^USER (\S+)$", DOCKERFILE, re.M)[-1])


# --- Kubernetes -----------------------------------------------------------------------------------


def _by_kind(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in MANIFESTS if d["kind"] == kind}


def _workloads() -> list[dict]:
    return [*_by_kind("Deployment").values(), *_by_kind("Job").values()]


def _containers(workload: dict) -> list[dict]:
    pod = workload["spec"]["template"]["spec"]
    return pod["containers"] + pod.get("initContainers", [])


def _quantity(value: str | int) -> float:
    text = str(value)
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def test_every_container_has_requests_and_limits_within_them():
    for workload in _workloads():
        for container in _containers(workload):
            resources = container["resources"]
            for what in ("cpu", "memory"):
                request = _quantity(resources["requests"][what])
                limit = _quantity(resources["limits"][what])
                assert 0 < request <= limit, (workload["metadata"]["name"], container["name"], what)


def test_secrets_are_referenced_never_written():
    assert not _by_kind("Secret"), "a Secret with values in the repository"
    for name in _by_kind("ConfigMap")["scheduler"]["data"]:
        assert not SECRET_LOOKING.search(name), f"{name} belongs in the Secret"
    for workload in _workloads():
        for container in _containers(workload):
            env = {variable["name"]: variable for variable in container["env"]}
            assert {"DJANGO_SECRET_KEY", "DATABASE_URL"} <= set(env), container["name"]
            for name, variable in env.items():
                if SECRET_LOOKING.search(name):
                    assert "value" not in variable, f"{name} written in the manifest"
                    ref = variable["valueFrom"]["secretKeyRef"]
                    assert ref == {"name": "scheduler", "key": name}
            assert not any("secretRef" in source for source in container.get("envFrom", []))


def test_the_web_is_probed_on_the_apps_health_urls():
    [web] = _by_kind("Deployment")["scheduler-web"]["spec"]["template"]["spec"]["containers"]
    port = web["ports"][0]["containerPort"]
    assert web["readinessProbe"]["httpGet"] == {"path": reverse("health-ready"), "port": port}
    assert web["livenessProbe"]["httpGet"] == {"path": reverse("health-live"), "port": port}
    # The probes are answered before any host check (a kubelet probes the pod's address).
    assert settings.MIDDLEWARE[0] == "scheduler_project.health.ProbeMiddleware"


def _drain_grace(command: list[str]) -> float:
    from cluster.conf import KNOBS

    found = re.search(r"--grace[ =](\S+)", " ".join(command))
    return float(found.group(1)) if found else KNOBS["DRAIN_GRACE_S"][0]


def test_nodes_are_killed_only_after_their_drain_grace():
    pod = _by_kind("Deployment")["scheduler-node"]["spec"]["template"]["spec"]
    grace = _drain_grace(pod["containers"][0]["command"])
    # Leadership hand-over and the last writes after the runs' grace: at least 10 s more.
    assert pod["terminationGracePeriodSeconds"] >= grace + 10
    for name in ("node-1", "node-2", "node-3"):
        service = COMPOSE["services"][name]
        stop = float(service["stop_grace_period"].removesuffix("s"))
        assert stop >= _drain_grace(service["command"]) + 10, name


def test_nodes_spread_over_machines_and_leave_one_at_a_time():
    node = _by_kind("Deployment")["scheduler-node"]
    labels = node["spec"]["template"]["metadata"]["labels"]
    anti = node["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    terms = [t["podAffinityTerm"] for t in anti["preferredDuringSchedulingIgnoredDuringExecution"]]
    assert any(
        t["topologyKey"] == "kubernetes.io/hostname"
        and t["labelSelector"]["matchLabels"].items() <= labels.items()
        for t in terms
    )
    pdb = _by_kind("PodDisruptionBudget")["scheduler-node"]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["maxUnavailable"] == 1 < node["spec"]["replicas"]
    assert node["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_a_job_migrates_and_the_deployments_wait_for_it():
    [migrate] = _by_kind("Job")["scheduler-migrate"]["spec"]["template"]["spec"]["containers"]
    assert migrate["command"] == ["python", "manage.py", "migrate", "--noinput"]
    for deployment in _by_kind("Deployment").values():
        [wait] = deployment["spec"]["template"]["spec"]["initContainers"]
        assert "manage.py migrate --check" in wait["command"][-1]
        assert wait["image"] == deployment["spec"]["template"]["spec"]["containers"][0]["image"]


@pytest.mark.parametrize("name", ["scheduler-migrate", "scheduler-web", "scheduler-node"])
def test_pods_run_as_the_images_user_on_a_read_only_root(name):
    workload = {**_by_kind("Deployment"), **_by_kind("Job")}[name]
    pod = workload["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == _image_user()
    volumes = {v["name"] for v in pod["volumes"]}
    for container in _containers(workload):
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert {"/tmp", "/app/var"} <= set(mounts) and set(mounts.values()) <= volumes


# --- compose --------------------------------------------------------------------------------------


def test_compose_references_only_what_it_defines():
    """What the compose spec's schema (make deploy-lint) cannot check: names between sections."""
    services = COMPOSE["services"]
    for name, service in services.items():
        assert set(service.get("depends_on", {})) <= set(services), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in COMPOSE["volumes"], (name, source)
        for config in service.get("configs", []):
            assert config["source"] in COMPOSE["configs"], (name, config)
