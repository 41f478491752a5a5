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
    for source in re.findall(r"^COPY (\S+) ", dockerfile, re.M):
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
