"""The docker/ files cannot be built here (no Docker engine); check what can be checked: they parse,
and they name what the project really has."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_compose_file_defines_the_cluster():
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    services = compose["services"]
    assert {"mariadb", "redis", "migrate", "web", "node-1", "node-2", "node-3"} <= set(services)
    for name in ("node-1", "node-2", "node-3"):
        assert services[name]["command"][:3] == ["python", "manage.py", "runnode"]
    assert services["web"]["environment"]["DATABASE_URL"].startswith("mysql://")


def test_dockerfile_copies_only_existing_paths():
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    for source in re.findall(r"^COPY (?!--from=)(\S+) ", dockerfile, re.M):
        assert (ROOT / source).exists(), source


def test_kubernetes_manifests_parse():
    documents = list(yaml.safe_load_all((ROOT / "docker" / "k8s" / "scheduler.yaml").read_text()))
    kinds = [d["kind"] for d in documents]
    assert kinds.count("Deployment") == 2 and "Job" in kinds


def test_node_pods_are_probed_on_the_port_runnode_serves_its_metrics_on():
    from cluster.management.commands.runnode import Command

    documents = list(yaml.safe_load_all((ROOT / "docker" / "k8s" / "scheduler.yaml").read_text()))
    [node] = [
        d
        for d in documents
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "scheduler-node"
    ]
    container = node["spec"]["template"]["spec"]["containers"][0]
    command = container["command"][-1]
    port = int(re.search(r"--metrics-port (\d+)", command).group(1))
    assert container["readinessProbe"]["httpGet"] == {"path": "/health/ready", "port": port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": port}
    assert node["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    # runnode really takes the flags the manifest and the compose file give it.
    parser = Command().create_parser("manage.py", "runnode")
    argv = command.split("runnode", 1)[1].split()  # --node-id "$HOSTNAME" ... (a shell line)
    assert parser.parse_args(argv).metrics_port == port
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    for name in ("node-1", "node-2", "node-3"):
        parsed = parser.parse_args(compose["services"][name]["command"][3:])
        assert parsed.metrics_port == 9100


def _stages(dockerfile: str) -> list[str]:
    return re.split(r"^FROM ", dockerfile, flags=re.M)[1:]


def _apt_installs(text: str) -> list[str]:
    packages = []
    for line in re.findall(r"apt-get install ([^\n&\\]+)", text):
        packages += [word for word in line.split() if not word.startswith("-")]
    return packages


def test_the_image_is_multi_stage_non_root_and_installs_no_build_tools_in_the_final_stage():
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    stages = _stages(dockerfile)
    assert len(stages) == 2, "a builder stage and a final stage"
    final = stages[-1]
    # Debian's Python, the runtime library mysqlclient needs, CA certificates, the zone database.
    assert set(_apt_installs(final)) == {"python3", "libmariadb3", "ca-certificates", "tzdata"}
    assert "gcc" in _apt_installs(stages[0])
    assert re.search(r"^USER (?!root)\S+", final, re.M)
    assert re.search(r"^HEALTHCHECK .*health/live", final, re.M | re.S)
    # Every install in a RUN comes after that RUN's own apt-get update (the lists are removed at
    # the end of each RUN: an install in a later one could find nothing).
    for run in re.findall(r"^RUN (.*?)(?=^\S|\Z)", dockerfile, re.M | re.S):
        if "apt-get install" in run:
            assert run.index("apt-get update") < run.index("apt-get install"), run


def test_every_package_the_image_installs_exists_in_its_debian_release():
    """Checked with this machine's apt when it runs the image's Debian release (bookworm)."""
    import shutil
    import subprocess

    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    release = re.search(r"^ARG BASE=debian:(\w+)-slim$", dockerfile, re.M).group(1)
    os_release = Path("/etc/os-release")
    here = (
        re.search(r"^VERSION_CODENAME=(\w+)", os_release.read_text(), re.M)
        if os_release.exists()
        else None
    )
    if shutil.which("apt-cache") is None or here is None or here.group(1) != release:
        import pytest

        pytest.skip(f"needs apt on Debian {release}")
    for package in set(_apt_installs(dockerfile)):
        shown = subprocess.run(
            ["apt-cache", "show", "--no-all-versions", package],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0 and "Version:" in shown.stdout, package


def test_compose_builds_one_image_and_checks_each_services_health_where_it_listens():
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    services = compose["services"]
    built = [name for name, service in services.items() if "build" in service]
    assert {services[name]["image"] for name in built} == {"${SCHEDULER_IMAGE:-scheduler:local}"}
    for name in ("node-1", "node-2", "node-3"):
        test = " ".join(services[name]["healthcheck"]["test"])
        assert "127.0.0.1:9100/health/live" in test and "stop_grace_period" in services[name]
    assert "8000/health/ready" in " ".join(services["web"]["healthcheck"]["test"])


# Variables the images and manifests may set that the code does not read by name: Python's and
# third-party ones.
EXTERNAL_VARIABLES = {
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED",
    "DJANGO_SETTINGS_MODULE",
    "PATH",
}


def _read_by_code() -> str:
    return "\n".join(
        path.read_text()
        for folder in ("scheduler_project", "jobs", "cluster")
        for path in (ROOT / folder).rglob("*.py")
    )


def test_every_variable_and_command_the_deploy_files_use_exists_in_the_code():
    from django.core.management import get_commands

    code = _read_by_code()
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    documents = list(yaml.safe_load_all((ROOT / "docker" / "k8s" / "scheduler.yaml").read_text()))
    variables = set(compose["x-app"]["environment"])
    commands = []
    for service in compose["services"].values():
        if "build" in service and "command" in service:  # else the image's CMD (daphne)
            commands.append(service["command"])
    for document in documents:
        if document["kind"] in ("ConfigMap", "Secret"):
            variables |= set(document.get("data") or document.get("stringData"))
        spec = document.get("spec", {})
        pod = spec.get("template", {}).get("spec", {})
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            variables |= {variable["name"] for variable in container.get("env", [])}
            if "command" in container:
                commands.append(container["command"])
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    variables |= set(re.findall(r"^\s+(\w+)=\S+ ?\\?$", dockerfile, re.M))
    for variable in variables - EXTERNAL_VARIABLES:
        assert f'"{variable}"' in code, f"{variable} is set by the deploy files but read nowhere"
    known = set(get_commands())
    for command in commands:
        words = " ".join(command).split()
        used = words[words.index("manage.py") + 1]
        assert used in known, f"manage.py {used}"


def test_the_monitoring_profile_scrapes_what_the_processes_serve():
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    services = compose["services"]
    assert services["prometheus"]["profiles"] == ["monitoring"]
    prometheus = yaml.safe_load((ROOT / "docker" / "monitoring" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    assert jobs["scheduler-web"]["static_configs"][0]["targets"] == ["web:8000"]
    assert (
        jobs["scheduler-web"]["authorization"]["credentials_file"]
        == (services["prometheus"]["configs"][0]["target"])
    )
    nodes = jobs["scheduler-nodes"]["static_configs"][0]["targets"]
    assert nodes == [f"node-{i}:9100" for i in (1, 2, 3)]
    # Every series the dashboard plots is one the code exports.
    import json

    code = _read_by_code()
    dashboard = json.loads(
        (ROOT / "docker" / "monitoring" / "grafana" / "dashboards" / "scheduler.json").read_text()
    )
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for series in set(re.findall(r"scheduler_\w+", exprs)):
        base = re.sub(r"_(bucket|total|count|sum)$", "", series)
        assert f'"{base}"' in code, series
