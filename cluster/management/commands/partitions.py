"""``python manage.py partitions [--json]``: how many scheduling partitions there are, who leads
each (node, term) and how many jobs each fires. ``partitions --set P``: change the count, with
the cluster stopped (docs/operations.md, "Scheduling partitions")."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from cluster import selectors
from cluster.models import NodeStatus, SchedulerNode
from jobs import partitioning

EXIT_USAGE = 2
ERR_NODES_RUNNING = (
    "{count} node(s) are running ({nodes}): stop every node first (a node keeps the count it "
    "started with, and nodes that disagree on it would fire a job twice or never); "
    "--force changes it anyway, and the running nodes then drain themselves"
)


class Command(BaseCommand):
    help = "Show the scheduling partitions and their leaders, or change how many there are."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON.")
        parser.add_argument(
            "--set",
            type=int,
            dest="count",
            metavar="P",
            help=f"Split the jobs into P partitions (1 to {partitioning.MAX_PARTITIONS}).",
        )
        parser.add_argument(
            "--force", action="store_true", help="Change the count even while nodes run."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["count"] is not None:
            self._set(options["count"], force=options["force"])
            return
        rows = selectors.partition_leaders()
        if options["json"]:
            self.stdout.write(
                json.dumps({"partitions": len(rows), "leaders": rows}, indent=2, default=str)
            )
            return
        self.stdout.write(f"partitions: {len(rows)}")
        for row in rows:
            leader = f"{row['node']} (term {row['term']})" if row["node"] else "- (no leader)"
            self.stdout.write(f"  {row['partition']:>3}  {leader:<40} {row['jobs']} jobs")

    def _set(self, count: int, *, force: bool) -> None:
        problem = partitioning.count_problem(count)
        if problem:
            raise CommandError(problem, returncode=EXIT_USAGE)
        recent = timezone.now() - timedelta(seconds=30)
        running = list(
            SchedulerNode.objects.filter(
                status__in=[NodeStatus.ACTIVE, NodeStatus.DRAINING], last_heartbeat__gte=recent
            ).values_list("node_id", flat=True)
        )
        if running and not force:
            raise CommandError(
                ERR_NODES_RUNNING.format(count=len(running), nodes=", ".join(running)),
                returncode=EXIT_USAGE,
            )
        before = partitioning.count(fresh=True)
        moved = partitioning.set_count(count)
        self.stdout.write(
            f"partitions: {before} -> {count}; {moved} job(s) moved to their new partition"
        )
