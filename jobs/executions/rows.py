"""Runs read by the hot path without the ORM's per-row cost: a row loader per database vendor and a
per-process cache of jobs, checked against the stamps read with each claim."""

from __future__ import annotations

import contextlib
import functools
import json
import random
import threading
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Model, QuerySet

from jobs.models import Job, JobExecution

# The JSON texts most columns hold (no arguments, no tags, no chain), each decoded by making a new
# one: six documents a job, and json.loads was half of reading one.
EMPTY_DOCUMENTS: dict[str, Callable[[], Any]] = {"[]": list, "{}": dict}


@functools.cache
def row_loader(
    vendor: str, model: type[Model] = JobExecution, names: tuple[str, ...] | None = None
) -> Callable[[tuple], Any]:
    """A function from a row of ``model`` (every concrete column, in order; or the fields of
    ``names``, in that order) to an instance, equal to what the ORM reads (the tests of claimed
    rows and of cached jobs compare every field). Fields left out of ``names`` are deferred, as
    ``QuerySet.only`` leaves them: read from the database when first used.

    The instance is made without ``Model.__init__`` (its generic handling of positional, keyword
    and deferred values cost more than the row's query): its attributes are set in its
    ``__dict__`` and its state marked loaded, which is what ``__init__`` and ``from_db`` leave
    (the model has no init signal receivers). On MariaDB/MySQL, whose DATETIMEs arrive naive in
    the connection's time zone (UTC), the columns are converted in place by kind (dates made
    aware, JSON decoded, booleans) instead of through the converters' generic signature; any
    other column or engine goes through the converters themselves."""
    from django.db.models.base import ModelState

    fields = (
        model._meta.concrete_fields
        if names is None
        else [model._meta.get_field(name) for name in names]
    )
    attnames = [field.attname for field in fields]
    dates: list[int] = []
    documents: list[int] = []
    flags: list[int] = []
    generic = []
    specialised = vendor == "mysql" and settings.USE_TZ and connection.timezone_name == "UTC"
    for index, field in enumerate(fields):
        kind = field.get_internal_type()
        if specialised and kind == "DateTimeField":
            dates.append(index)
        elif specialised and kind == "JSONField" and field.decoder is None:
            documents.append(index)
        elif specialised and kind == "BooleanField":
            flags.append(index)
        else:
            column = field.get_col(model._meta.db_table)
            functions = connection.ops.get_db_converters(column) + column.get_db_converters(
                connection
            )
            if functions:
                generic.append((index, column, functions))
    alias = connection.alias
    conn = connection
    new = model.__new__
    loads = json.loads

    def load(row: tuple) -> Any:
        values = list(row)
        for index in dates:
            value = values[index]
            if value is not None:
                values[index] = value.replace(tzinfo=UTC)
        for index in documents:
            value = values[index]
            if value is not None:
                empty = EMPTY_DOCUMENTS.get(value)
                if empty is not None:
                    values[index] = empty()
                    continue
                # As JSONField.from_db_value: a value that is not JSON stays as it is.
                with contextlib.suppress(json.JSONDecodeError):
                    values[index] = loads(value)
        for index in flags:
            if values[index] in (0, 1):
                values[index] = bool(values[index])
        for index, column, functions in generic:
            value = values[index]
            for function in functions:
                value = function(value, column, conn)
            values[index] = value
        instance = new(model)
        state = instance._state = ModelState()
        state.adding, state.db = False, alias
        instance.__dict__.update(zip(attnames, values, strict=True))
        return instance

    return load


def select_rows(
    model: type[Model],
    where: str,
    params: list[Any],
    *,
    names: tuple[str, ...] | None = None,
    order: str = "",
) -> list[Any]:
    """Rows of ``model`` (every field, or those of ``names``, the others deferred) matching
    ``where`` (SQL over the model's own column names, ``%s`` for ``params``, which are given as
    the driver takes them: dates adapted by ``connection.ops``), in ``order`` (SQL), made
    instances by ``row_loader``. For the queries an admission makes per batch: building them
    through the ORM (its query, its compiler) cost more than running them, which find nothing
    in the usual case."""
    q = connection.ops.quote_name
    meta = model._meta
    fields = meta.concrete_fields if names is None else [meta.get_field(n) for n in names]
    columns = ", ".join(q(field.column) for field in fields)
    sql = f"SELECT {columns} FROM {q(meta.db_table)} WHERE {where}"  # noqa: S608 (names only)
    if order:
        sql += f" ORDER BY {order}"
    load = row_loader(connection.vendor, model, names)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [load(row) for row in cursor.fetchall()]


def load_rows(queryset: QuerySet, names: tuple[str, ...], limit: int) -> list[Any]:
    """``list(queryset.only(*names)[:limit])`` without the ORM's cost per row: the queryset's own
    statement (its filters, order and row locks) for the columns of ``names`` (the primary key's
    among them), each row made an instance by ``row_loader``, the other fields deferred. The
    leader's tick reads its due jobs so: building them through ``Model.from_db`` was an eighth of
    its pass at 2,000 fires a second."""
    sliced = queryset.values_list(*names)[:limit]
    sql, params = sliced.query.get_compiler(using=sliced.db).as_sql()
    load = row_loader(connection.vendor, queryset.model, names)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [load(row) for row in cursor.fetchall()]


def attach_jobs(rows: list[JobExecution], stamps: dict[int, tuple[Any, Any]] | None = None) -> None:
    """Give each execution its job: one instance per job (not a copy per row, as a join would
    build), from this process's cache when the job's row still carries the version and creation
    stamp it was cached with (``stamps``, read with the claim's candidates; else one small query
    for the batch), else read again with the ORM."""
    ids = {row.job_id for row in rows}
    jobs = _job_cache.current(ids, stamps)
    # The relation's cache set directly: each row's job_id is the job's already (the descriptor's
    # assignment would set it again and check the instance, 2 us a row).
    cache = JobExecution.job.field.set_cached_value
    for row in rows:
        cache(row, jobs[row.job_id])


class _JobCache:
    """Jobs as the claims last read them, checked against their rows' ``version`` and
    ``created_at`` before use: every edit of a definition, a pause and a resume raise the version,
    and the creation stamp tells a job from another that got its id (a rolled-back test's id
    given again). The leader's advance of a job's fire times raises neither (it stamps
    ``updated_at`` for the dashboard), and a run reads none of them: with ``updated_at`` in the
    check, every fire made its job's entry stale, and at 100,000 jobs every claimed run read its
    job again through the ORM. A miss reads the jobs' rows with the row loader, not the ORM."""

    # The default bound (runnode --job-cache-size sets the process's own).
    LIMIT = 10_000
    # A full cache takes a new job in place of its oldest entry this rarely: claims that cycle
    # through more jobs than the bound (a node of a large cluster sees every job of its share once
    # an interval) then keep finding the bound's worth, where taking every one in (or forgetting
    # everything) would find next to none; jobs no longer claimed (deleted, one-off) still leave.
    ADMIT_WHEN_FULL = 0.05

    def __init__(self, limit: int = LIMIT, rng: random.Random | None = None) -> None:
        self._jobs: OrderedDict[int, tuple[tuple[Any, Any], Job]] = OrderedDict()
        self._lock = threading.Lock()
        self.limit = limit
        self._random = rng or random.Random()

    def __len__(self) -> int:
        return len(self._jobs)

    def resize(self, limit: int) -> None:
        """A new bound; the oldest entries past it go."""
        with self._lock:
            self.limit = limit
            while len(self._jobs) > limit:
                self._jobs.popitem(last=False)

    def current(
        self, ids: set[int], known: dict[int, tuple[Any, Any]] | None = None
    ) -> dict[int, Job]:
        """The jobs of ``ids``; ``known`` gives their stamps as just read (else they are read)."""
        if not ids:
            return {}
        if known is not None and ids <= known.keys():
            stamps = {pk: known[pk] for pk in ids}
        else:
            stamps = self._stamps(ids)
        found: dict[int, Job] = {}
        with self._lock:
            for pk, stamp in stamps.items():
                cached = self._jobs.get(pk)
                if cached is not None and cached[0] == stamp:
                    found[pk] = cached[1]
        stale = set(stamps) - set(found)
        if stale:
            fresh = self._read(stale)
            found.update(fresh)
            with self._lock:
                self._keep(fresh, stamps)
        return found

    def _keep(self, fresh: dict[int, Job], stamps: dict[int, tuple[Any, Any]]) -> None:
        """Cache ``fresh`` within the bound (the caller holds the lock): a job already cached is
        replaced; a new one goes in while there is room, else now and then in place of the
        oldest (``ADMIT_WHEN_FULL``)."""
        for pk, job in fresh.items():
            if pk in self._jobs or len(self._jobs) < self.limit:
                self._jobs[pk] = (stamps[pk], job)
            elif self.limit > 0 and self._random.random() < self.ADMIT_WHEN_FULL:
                self._jobs.popitem(last=False)
                self._jobs[pk] = (stamps[pk], job)

    @staticmethod
    def _read(ids: set[int]) -> dict[int, Job]:
        """The jobs of ``ids``, every column, as the ORM would read them (one query)."""
        q = connection.ops.quote_name
        columns = ", ".join(q(field.column) for field in Job._meta.concrete_fields)
        marks = ", ".join(["%s"] * len(ids))
        sql = f"SELECT {columns} FROM {q(Job._meta.db_table)} WHERE {q('id')} IN ({marks})"  # noqa: S608
        load = row_loader(connection.vendor, Job)
        with connection.cursor() as cursor:
            cursor.execute(sql, list(ids))
            return {job.pk: job for job in map(load, cursor.fetchall())}

    @staticmethod
    def _stamps(ids: set[int]) -> dict[int, tuple[Any, Any]]:
        q = connection.ops.quote_name
        marks = ", ".join(["%s"] * len(ids))
        sql = (
            f"SELECT {q('id')}, {q('version')}, {q('created_at')} FROM {q(Job._meta.db_table)} "  # noqa: S608
            f"WHERE {q('id')} IN ({marks})"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, list(ids))
            return {pk: (version, created) for pk, version, created in cursor.fetchall()}


_job_cache = _JobCache()


def set_job_cache_size(size: int) -> None:
    """Bound this process's job cache to ``size`` jobs (0: keep none)."""
    _job_cache.resize(size)
