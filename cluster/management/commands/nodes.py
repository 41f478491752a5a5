"""Operator CLI for the cluster: ``python manage.py nodes list [--json]``, ``nodes drain NODE_ID``
and ``nodes forget NODE_ID`` (remove a dead or stopped node from the list)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from cluster import selectors, services
from cluster.behind import describe as describe_behind
from cluster.models import SchedulerNode
from jobs.models import AuditSource
from jobs.services import ActionNotAllowed, Actor

EXIT_USAGE = 2
# action -> (the service it calls, what it prints when done)
NODE_ACTIONS = {
    "drain": (services.node_request_drain, "drain requested for {node}"),
    "forget": (services.node_forget, "removed {node}"),
}


class Command(BaseCommand):
    help = "List scheduler nodes (leader, heartbeat age) or ask one to drain."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list", help="List nodes").add_argument("--json", action="store_true")
        sub.add_parser("drain", help="Ask a node to drain and stop").add_argument("node_id")
        sub.add_parser("forget", help="Remove a dead or stopped node from the list").add_argument(
            "node_id"
        )

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        if action in NODE_ACTIONS:
            service, done = NODE_ACTIONS[action]
            node = SchedulerNode.objects.filter(node_id=options["node_id"]).first()
            if node is None:
                raise CommandError(f"no node {options['node_id']!r}", returncode=EXIT_USAGE)
            try:
                service(node_pk=node.pk, by=Actor(source=AuditSource.CLI))
            except ActionNotAllowed as exc:
                raise CommandError(str(exc), returncode=EXIT_USAGE) from exc
            self.stdout.write(done.format(node=node.node_id))
            return
        state = selectors.cluster_state()
        now = timezone.now()
        rows = []
        for node in SchedulerNode.objects.order_by("node_id"):
            rows.append(
                {
                    "node_id": node.node_id,
                    "leader": node.node_id == state["leader"],
                    "status": node.status,
                    "heartbeat_age_s": round((now - node.last_heartbeat).total_seconds(), 1),
                    "running": node.running_count,
                    "capacity": node.capacity,
                    "queues": node.queues,
                    "host": f"{node.hostname}:{node.pid}",
                }
            )
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "leader": state["leader"],
                        "term": state["term"],
                        "behind": state["behind"],
                        "nodes": rows,
                    },
                    indent=2,
                )
            )
            return
        self.stdout.write(f"leader: {state['leader'] or '-'}  term: {state['term'] or '-'}")
        if state["behind"]:
            self.stdout.write(describe_behind(state["behind"]))
        self.stdout.write(f"{'NODE':24} {'STATUS':9} {'HEARTBEAT':>9} {'RUN/CAP':>8} HOST")
        for row in rows:
            mark = "*" if row["leader"] else " "
            self.stdout.write(
                f"{mark}{row['node_id'][:23]:23} {row['status']:9} {row['heartbeat_age_s']:>8}s "
                f"{row['running']:>3}/{row['capacity']:<4} {row['host']}"
            )
