"""Operator CLI for jobs: list, trigger, pause, resume, export and apply definitions; the tasks.

    python manage.py jobs list [--json]
    python manage.py jobs trigger NAME
    python manage.py jobs enqueue NAME [--kwargs JSON] [--args JSON] [--run-at ISO] [--priority N]
                                       [--count N] | [--file FILE]
    python manage.py jobs pause NAME | resume NAME
    python manage.py jobs export [--format yaml|json] [--output FILE] [NAME ...]
    python manage.py jobs apply FILE [--dry-run] [--prune]
    python manage.py jobs apply --from-code [--dry-run] [--prune]
    python manage.py jobs tasks [--json]
    python manage.py jobs purge-runs --older-than-days N [--batch N] [--max-rows N] [--dry-run]
    python manage.py jobs queues [--json]
    python manage.py jobs queue NAME [--max-concurrent N|none] [--rate-limit N|none]
                                     [--rate-period SECONDS]
    python manage.py jobs queue-pause NAME | queue-resume NAME

Errors print a message and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import json as json_module
import sys
from pathlib import Path
from typing import Any

import yaml
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from jobs import (
    declarations,
    notification_rules,
    queues,
    registry,
    retention,
    selectors,
    services,
)
from jobs.models import AuditSource, Job
from jobs.services import ActionNotAllowed, Actor
from jobs.validation import JobValidationError

CLI_ACTOR = Actor(source=AuditSource.CLI)
EXIT_USAGE = 2


class Command(BaseCommand):
    help = "List, trigger, pause, resume, export and apply jobs."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list", help="List jobs")
        listing.add_argument("--json", action="store_true", help="Machine-readable output")
        listing.add_argument("--tag", help="Only the jobs carrying this tag")
        tasks = sub.add_parser("tasks", help="List the registered tasks and their arguments")
        tasks.add_argument("--json", action="store_true", help="Machine-readable output")
        for name in ("trigger", "pause", "resume"):
            one = sub.add_parser(name, help=f"{name.capitalize()} a job, or every job with a tag")
            one.add_argument("job", nargs="?")
            one.add_argument("--tag", help="Every job carrying this tag (instead of one job)")
        enqueue = sub.add_parser(
            "enqueue",
            help="Enqueue runs of a job with arguments of their own (the API's enqueue): all or "
            "none",
        )
        enqueue.add_argument("job")
        # (dest: "args" is BaseCommand.execute's own)
        enqueue.add_argument(
            "--args", dest="run_args", help="JSON list: the run's positional arguments"
        )
        enqueue.add_argument(
            "--kwargs", dest="run_kwargs", help="JSON object: the run's keyword arguments"
        )
        enqueue.add_argument("--run-at", help="ISO 8601 instant (default: now)")
        enqueue.add_argument("--priority", type=int, help="The run's priority (default: the job's)")
        enqueue.add_argument("--count", type=int, default=1, help="That many runs (default 1)")
        enqueue.add_argument(
            "--file",
            help="JSON/YAML list of runs ({args, kwargs, run_at, priority} each), or - for "
            "standard input; instead of the options above",
        )
        export = sub.add_parser("export", help="Write job definitions as YAML or JSON")
        export.add_argument("names", nargs="*")
        export.add_argument("--format", choices=["yaml", "json"], default="yaml")
        export.add_argument("--output", "-o", help="File to write (default: standard output)")
        apply = sub.add_parser("apply", help="Create/update jobs by name from a YAML/JSON file")
        apply.add_argument("file", nargs="?", help="Path, or - for standard input")
        apply.add_argument(
            "--from-code",
            action="store_true",
            help="Apply the jobs declared in code (declare_job, @task(schedule=)), not a file",
        )
        apply.add_argument("--dry-run", action="store_true", help="Show the diff, write nothing")
        apply.add_argument("--prune", action="store_true", help="Delete jobs absent from the file")
        purge = sub.add_parser(
            "purge-runs",
            help="Delete finished runs older than a number of days (each job's newest is kept)",
        )
        purge.add_argument("--older-than-days", type=float, required=True)
        purge.add_argument("--batch", type=int, default=retention.PURGE_BATCH)
        purge.add_argument("--max-rows", type=int, default=retention.PURGE_MAX_ROWS)
        purge.add_argument("--dry-run", action="store_true", help="Count, delete nothing")
        listing_queues = sub.add_parser(
            "queues", help="List the queues: their flow control, what runs and what waits"
        )
        listing_queues.add_argument("--json", action="store_true", help="Machine-readable output")
        queue = sub.add_parser(
            "queue", help="Set a queue's flow control (what is not given is left as it is)"
        )
        queue.add_argument("name")
        queue.add_argument(
            "--max-concurrent", type=_limit, help="At most N runs of the queue at once, or none"
        )
        queue.add_argument(
            "--rate-limit", type=_limit, help="At most N starts per rate period, or none"
        )
        queue.add_argument("--rate-period", type=int, help="The rate limit's period in seconds")
        for name in ("queue-pause", "queue-resume"):
            one = sub.add_parser(name, help=f"{name.split('-')[1].capitalize()} a whole queue")
            one.add_argument("name")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            getattr(self, f"do_{action.replace('-', '_')}")(**options)
        except Job.DoesNotExist as exc:
            raise CommandError(str(exc), returncode=EXIT_USAGE) from exc
        except JobValidationError as exc:
            lines = [f"  {field}: {' '.join(reasons)}" for field, reasons in exc.errors.items()]
            what = {
                "enqueue": "run(s)",
                "queue": "queue setting(s)",
                "queue-pause": "queue",
                "queue-resume": "queue",
            }.get(action, "job definition(s)")
            raise CommandError(
                f"invalid {what}, nothing written:\n" + "\n".join(lines),
                returncode=EXIT_USAGE,
            ) from exc
        except (ActionNotAllowed, retention.BadPurgeArgument) as exc:
            raise CommandError(str(exc), returncode=EXIT_USAGE) from exc

    def do_list(self, *, json: bool = False, tag: str | None = None, **_: Any) -> None:
        jobs = list(
            selectors.job_list().filter(selectors.tagged(tag)) if tag else selectors.job_list()
        )
        if json:
            names = [job.name for job in jobs] if tag else None
            self.stdout.write(_dumps_json(selectors.job_definitions_export(names=names)))
            return
        header = f"{'NAME':30} {'TASK':20} {'SCHEDULE':28} {'ENABLED':8} NEXT FIRE (UTC)"
        self.stdout.write(header)
        for job in jobs:
            schedule = job.cron_expression or (
                f"every {job.interval_seconds}s"
                if job.interval_seconds
                else f"once {job.run_at:%Y-%m-%d %H:%M:%S}"
            )
            next_fire = job.next_fire_at.strftime("%Y-%m-%d %H:%M:%S") if job.next_fire_at else "-"
            self.stdout.write(
                f"{job.name[:30]:30} {job.task[:20]:20} {schedule[:28]:28} "
                f"{'yes' if job.enabled else 'no':8} {next_fire}"
            )

    def do_tasks(self, *, json: bool = False, **_: Any) -> None:
        catalog = registry.task_catalog()
        if json:
            self.stdout.write(_dumps_json(catalog))
            return
        for entry in catalog:
            self.stdout.write(f"{entry['name']}: {entry['description']}")
            for param in entry["parameters"]:
                default = "required" if param["required"] else f"default {param['default']!r}"
                self.stdout.write(f"    {param['name']} ({param['type']}, {default})")
            example = entry["example"]
            if example.get("args") or example.get("kwargs"):
                self.stdout.write(f"    example: {json_module.dumps(example)}")

    def do_purge_runs(
        self, *, older_than_days: float, batch: int, max_rows: int, dry_run: bool, **_: Any
    ) -> None:
        result = services.runs_purge(
            older_than_days=older_than_days,
            batch=batch,
            max_rows=max_rows,
            dry_run=dry_run,
            by=CLI_ACTOR,
        )
        verb = "would delete" if dry_run else "deleted"
        more = "" if result.complete else f" (stopped at --max-rows {max_rows}; more remain)"
        self.stdout.write(
            f"{verb} {result.deleted} runs finished before {result.cutoff:%Y-%m-%d %H:%M:%S} UTC"
            f"{more}"
        )

    def _targets(self, job: str | None, tag: str | None) -> list[Any]:
        """The job named (or numbered) ``job``, or every job carrying ``tag``: one of the two."""
        if (job is None) == (tag is None):
            raise CommandError("name one job, or give --tag (not both)", returncode=EXIT_USAGE)
        if job is not None:
            return [selectors.job_get_by_name_or_id(job)]
        found = list(selectors.job_list().filter(selectors.tagged(tag or "")))
        if not found:
            raise CommandError(f"no job carries the tag {tag!r}", returncode=EXIT_USAGE)
        return found

    def do_trigger(self, *, job: str | None, tag: str | None = None, **_: Any) -> None:
        for target in self._targets(job, tag):
            execution = services.job_trigger(job_id=target.pk, by=CLI_ACTOR)
            self.stdout.write(f"triggered {target.name}: execution {execution.pk}")

    def do_enqueue(
        self,
        *,
        job: str,
        run_args: str | None,
        run_kwargs: str | None,
        run_at: str | None,
        priority: int | None,
        count: int,
        file: str | None,
        **_: Any,
    ) -> None:
        target = selectors.job_get_by_name_or_id(job)
        if file is not None:
            if any(v is not None for v in (run_args, run_kwargs, run_at, priority)) or count != 1:
                raise CommandError(
                    "--file gives every run: it goes with no other run option",
                    returncode=EXIT_USAGE,
                )
            items = _load_list(file, "runs")
        else:
            if not 1 <= count <= services.MAX_ENQUEUE_RUNS:
                raise CommandError(
                    f"--count must be within 1-{services.MAX_ENQUEUE_RUNS}", returncode=EXIT_USAGE
                )
            item: dict[str, Any] = {}
            for name, raw in (("args", run_args), ("kwargs", run_kwargs)):
                if raw is not None:
                    try:
                        item[name] = json_module.loads(raw)
                    except ValueError as exc:
                        raise CommandError(
                            f"--{name} is not JSON: {exc}", returncode=EXIT_USAGE
                        ) from exc
            if run_at is not None:
                item["run_at"] = run_at
            if priority is not None:
                item["priority"] = priority
            items = [dict(item) for _ in range(count)]
        runs = services.runs_enqueue(job_id=target.pk, items=items, by=CLI_ACTOR)
        ids = [run.pk for run in runs if run.newly_enqueued]
        kept = len(runs) - len(ids)
        shown = ", ".join(map(str, ids)) if len(ids) <= 10 else f"{ids[0]} ... {ids[-1]}"
        line = f"enqueued {len(ids)} run(s) of {target.name}" + (f": {shown}" if ids else "")
        if kept:
            line += f"; {kept} already enqueued under their idempotency_key"
        self.stdout.write(line)

    def do_pause(self, *, job: str | None, tag: str | None = None, **_: Any) -> None:
        for found in self._targets(job, tag):
            target = services.job_pause(job_id=found.pk, by=CLI_ACTOR)
            self.stdout.write(f"paused {target.name}")

    def do_resume(self, *, job: str | None, tag: str | None = None, **_: Any) -> None:
        for found in self._targets(job, tag):
            target = services.job_resume(job_id=found.pk, by=CLI_ACTOR)
            self.stdout.write(f"resumed {target.name}; next fire {target.next_fire_at}")

    def do_queues(self, *, json: bool = False, **_: Any) -> None:
        views = queues.queues_overview()
        if json:
            self.stdout.write(_dumps_json([view.as_dict() for view in views]))
            return
        self.stdout.write(
            f"{'QUEUE':24} {'STATE':7} {'LIMIT':>6} {'RATE':>12} {'JOBS':>6} {'RUNNING':>8} "
            f"{'PENDING':>8} {'HELD':>6}"
        )
        for view in views:
            rate = f"{view.rate_limit}/{view.rate_period_seconds}s" if view.rate_limit else "-"
            self.stdout.write(
                f"{view.name:24} {'paused' if view.paused else 'active':7} "
                f"{view.max_concurrent or '-':>6} {rate:>12} {view.jobs:>6} {view.running:>8} "
                f"{view.pending:>8} {view.held:>6}"
            )

    def do_queue(
        self,
        *,
        name: str,
        max_concurrent: Any = None,
        rate_limit: Any = None,
        rate_period: int | None = None,
        **options: Any,
    ) -> None:
        data: dict[str, Any] = {}
        for key, value in (("max_concurrent", max_concurrent), ("rate_limit", rate_limit)):
            if value is not None:
                data[key] = None if value == "none" else value
        if rate_period is not None:
            data["rate_period_seconds"] = rate_period
        if not data:
            raise CommandError(
                "queue takes at least one of --max-concurrent, --rate-limit, --rate-period",
                returncode=EXIT_USAGE,
            )
        view = self._queue_saved(queues.queue_set(name=name, data=data, by=CLI_ACTOR))
        self.stdout.write(view)

    def do_queue_pause(self, *, name: str, **_: Any) -> None:
        queues.queue_pause(name=name, by=CLI_ACTOR)
        self.stdout.write(f"paused queue {name}: its runs wait until it is resumed")

    def do_queue_resume(self, *, name: str, **_: Any) -> None:
        queues.queue_resume(name=name, by=CLI_ACTOR)
        self.stdout.write(f"resumed queue {name}")

    @staticmethod
    def _queue_saved(queue: Any) -> str:
        rate = (
            f"{queue.rate_limit} per {queue.rate_period_seconds} s" if queue.rate_limit else "none"
        )
        return (
            f"queue {queue.name}: max_concurrent {queue.max_concurrent or 'none'}, rate {rate}"
            f"{', paused' if queue.paused else ''}"
        )

    def do_export(self, *, names: list[str], format: str, output: str | None, **_: Any) -> None:
        definitions = selectors.job_definitions_export(names=names or None)
        missing = set(names) - {d["name"] for d in definitions}
        if missing:
            raise CommandError(
                f"no such job(s): {', '.join(sorted(missing))}", returncode=EXIT_USAGE
            )
        document: dict[str, Any] = {"jobs": definitions}
        if not names:  # the whole installation: its queues and notification rules too
            document["queues"] = queues.queues_export()
            document["notification_rules"] = notification_rules.rules_export()
        if format == "json":
            text = _dumps_json(document)
        else:
            text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True)
        if output:
            Path(output).write_text(text)
            self.stderr.write(f"wrote {len(definitions)} job(s) to {output}")
        else:
            self.stdout.write(text)

    def do_apply(
        self, *, file: str | None, from_code: bool, dry_run: bool, prune: bool, **_: Any
    ) -> None:
        if from_code == (file is not None):
            raise CommandError(
                "apply takes a FILE or --from-code (one of them)", returncode=EXIT_USAGE
            )
        if from_code:
            definitions = declarations.declared_jobs()
            if not definitions:
                raise CommandError(
                    "no job is declared in code (declare_job, @task(schedule=)) in any installed "
                    "app's tasks.py or SCHEDULER_TASK_MODULES",
                    returncode=EXIT_USAGE,
                )
        rules = queue_settings = None
        if not from_code:
            assert file is not None
            data = _read(file)
            definitions = _as_list(data, file, "jobs", what="job definitions")
            if isinstance(data, dict) and "notification_rules" in data:
                rules = data["notification_rules"]
            if isinstance(data, dict) and "queues" in data:
                queue_settings = data["queues"]
        # The jobs, then the rules (which may name jobs the file creates), in one transaction:
        # a bad rule leaves the jobs as they were too. A dry run does it all, then rolls back.
        with transaction.atomic():
            # The queues first: a node's admission locks a queue's row before its jobs' rows, and
            # so does this (no two transactions wait on each other).
            queue_results = (
                queues.queues_apply(queue_settings, by=CLI_ACTOR)
                if queue_settings is not None
                else []
            )
            results = services.job_apply_definitions(
                definitions=definitions, by=CLI_ACTOR, dry_run=False, prune=prune
            )
            rule_results = (
                notification_rules.rules_apply(rules, by=CLI_ACTOR) if rules is not None else []
            )
            if dry_run:
                transaction.set_rollback(True)
        prefix = "(dry run) " if dry_run else ""
        for result in results:
            self.stdout.write(f"{prefix}{result.action:9} {result.name}")
            if result.action == "updated":
                for field, (before, after) in result.changes.items():
                    self.stdout.write(f"    {field}: {before!r} -> {after!r}")
        counts = {
            a: sum(r.action == a for r in results)
            for a in ("created", "updated", "unchanged", "deleted")
        }
        self.stdout.write(prefix + ", ".join(f"{n} {a}" for a, n in counts.items()))
        if rules is not None:
            for rule in rule_results:
                if rule.action != "unchanged":
                    self.stdout.write(f"{prefix}{rule.action:9} notification rule {rule.name}")
            made = {
                a: sum(r.action == a for r in rule_results)
                for a in ("created", "updated", "unchanged")
            }
            self.stdout.write(
                prefix + "notification rules: " + ", ".join(f"{n} {a}" for a, n in made.items())
            )
        if queue_settings is not None:
            for result in queue_results:
                if result.action != "unchanged":
                    self.stdout.write(f"{prefix}{result.action:9} queue {result.name}")
                    for field, (before, after) in result.changes.items():
                        self.stdout.write(f"    {field}: {before!r} -> {after!r}")
            made = {
                a: sum(r.action == a for r in queue_results)
                for a in ("created", "updated", "unchanged")
            }
            self.stdout.write(prefix + "queues: " + ", ".join(f"{n} {a}" for a, n in made.items()))


def _limit(value: str) -> int | str:
    """A flow limit on the command line: a whole number, or "none" (no limit)."""
    if value.lower() == "none":
        return "none"
    try:
        return int(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"a whole number or none, not {value!r}") from exc


def _dumps_json(data: Any) -> str:
    return json.dumps(data, indent=2, default=str)


def _read(file: str) -> Any:
    """The YAML/JSON document in ``file`` (``-``: standard input)."""
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
    except OSError as exc:
        raise CommandError(f"cannot read {file}: {exc.strerror}", returncode=EXIT_USAGE) from exc
    try:
        # YAML is a superset of JSON: one safe loader reads both. No custom tags, no objects.
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CommandError(f"{file} is not valid YAML/JSON: {exc}", returncode=EXIT_USAGE) from exc


def _load_list(file: str, key: str, *, what: str = "runs") -> list[Any]:
    """A YAML/JSON list from ``file`` (``-``: standard input), bare or as ``{key: [...]}``."""
    return _as_list(_read(file), file, key, what=what)


def _as_list(data: Any, file: str, key: str, *, what: str) -> list[Any]:
    if isinstance(data, dict) and key in data:
        data = data[key]
    if not isinstance(data, list):
        raise CommandError(
            f"{file}: expected a list of {what} (or {{{key}: [...]}})",
            returncode=EXIT_USAGE,
        )
    return data
