"""Statements for many rows at once, built in one pass without the ORM's machinery per row.

Django's ``bulk_update`` builds a ``Case(When(pk=..., then=Value(...)))`` expression per row and
field and resolves each (about 0.9 ms a job in the leader's tick of 5,000 one-off jobs, profiled);
``bulk_create`` prepares every field of every row generically. Both are in the hot paths (the
leader's fires, the finisher's outcomes, enqueued runs). Here a statement's text is built once per
call, with one placeholder per value: only the model's own table and column names go into the
text, and (``update``) values whose type guarantees a safe form (numbers, dates).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, models

Preparer = Callable[[Any], Any]
_ZERO = timedelta(0)
# Fields whose Python values both engines' drivers take as they are.
PLAIN_KINDS = frozenset(
    {
        "CharField",
        "TextField",
        "FloatField",
        "IntegerField",
        "BigIntegerField",
        "PositiveIntegerField",
        "BooleanField",
    }
)


def preparer(field: models.Field) -> Preparer:
    """How a value of ``field`` goes into a statement: as ``get_db_prep_save`` would, without its
    generic steps for the plain kinds (text and numbers as they are, dates adapted directly)."""
    kind = field.get_internal_type()
    if kind == "DateTimeField":
        if connection.vendor == "mysql" and settings.USE_TZ and connection.timezone_name == "UTC":
            return _utc_datetime_text
        adapt = connection.ops.adapt_datetimefield_value
        return lambda value: None if value is None else adapt(value)
    if kind in PLAIN_KINDS:
        return lambda value: value
    return lambda value: field.get_db_prep_save(value, connection)


def _utc_datetime_text(value: Any) -> Any:
    """A date-time as MariaDB/MySQL's adapter writes one for a UTC connection (naive, in UTC, as
    text), without its generic checks: an outcome carries two."""
    if type(value) is datetime and value.tzinfo is not None and value.utcoffset() == _ZERO:
        # UTC, or a zone at UTC's offset (a schedule's "UTC" zone): the text without its
        # "+00:00", a fifth of the cost of converting the date.
        return str(value)[:-6]
    if value is None or hasattr(value, "resolve_expression"):
        return value
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return str(value)


# Defaults a new instance may share with every other: immutable values.
_SHARED_DEFAULTS = (type(None), bool, int, float, str, Decimal, datetime)


@functools.cache
def maker(model: type[models.Model]) -> Callable[..., Any]:
    """A function from field values (by attribute name: ``job_id``, not ``job``) to a new, unsaved
    instance of ``model``, equal to ``model(**values)`` (the tests compare every attribute), for
    the hot paths that build hundreds of rows a second (the leader's fires).

    ``Model.__init__`` sorts positional from keyword values, resolves relations, sends the init
    signals and asks each field for its default, per instance: a fifth of the leader's tick at
    2,000 fires a second. Here the defaults that are plain values are taken once, a callable
    default is called per instance (as ``__init__`` would) when its field is not given, and the
    model has no init signal receivers (``row_loader`` makes the same assumption)."""
    from django.db.models.base import ModelState

    constant: dict[str, Any] = {}
    called: list[models.Field] = []
    for field in model._meta.concrete_fields:
        default = field.get_default()
        if field.has_default() and callable(field.default):
            called.append(field)
        elif isinstance(default, _SHARED_DEFAULTS):
            constant[field.attname] = default
        else:
            called.append(field)  # a mutable default: a fresh one per instance
    new = model.__new__
    attnames = {field.attname for field in model._meta.concrete_fields}

    def make(**values: Any) -> Any:
        unknown = values.keys() - attnames
        if unknown:
            raise TypeError(f"{model.__name__} has no field {sorted(unknown)[0]!r}")
        instance = new(model)
        instance._state = ModelState()
        attributes = instance.__dict__
        attributes.update(constant)
        for field in called:
            if field.attname not in values:
                attributes[field.attname] = field.get_default()
        attributes.update(values)
        return instance

    return make


def insert(
    model: type[models.Model],
    fields: Sequence[models.Field],
    rows: Sequence[Sequence[Any]],
    *,
    shared: dict[models.Field, Any] | None = None,
) -> list[int]:
    """INSERT ``rows`` (values prepared for the database, in ``fields``' order), and in every row
    the ``shared`` columns' values (prepared), in as few statements as the engine allows; returns
    the rows' ids in their order (``RETURNING``: no second query to find them).

    On MySQL/MariaDB every value is written into the statement's text as the driver would quote
    it (``_Literals``): the driver quoted each value of each row with a call of its own (about a
    tenth of the leader's tick at 2,000 fires a second, thirty values a fire), and most of them
    repeat from row to row (a status, a queue, an empty text)."""
    shared = shared or {}
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    all_fields = [*fields, *shared]
    columns = ", ".join(quote(field.column) for field in all_fields)
    per_statement = max(1, connection.ops.bulk_batch_size(all_fields, list(rows)))
    literals = _Literals.of(connection) if connection.vendor == "mysql" else None
    if literals is not None:
        shared_text = "".join(f", {literals.text(value)}" for value in shared.values())
    else:
        row_marks = "(" + ", ".join(["%s"] * len(all_fields)) + ")"
        shared_params = list(shared.values())
    returning = f"RETURNING {quote(model._meta.pk.column)}"
    ids: list[int] = []
    with connection.cursor() as cursor:
        for start in range(0, len(rows), per_statement):
            chunk = rows[start : start + per_statement]
            head = f"INSERT INTO {table} ({columns}) VALUES "  # noqa: S608 (names only, see above)
            if literals is not None:
                text = literals.text
                values = ", ".join(
                    f"({', '.join([text(value) for value in row])}{shared_text})" for row in chunk
                )
                # No parameters: the driver leaves the text as it is (no "%" to double).
                cursor.execute(f"{head}{values} {returning}")
            else:
                cursor.execute(
                    f"{head}{', '.join([row_marks] * len(chunk))} {returning}",
                    [value for row in chunk for value in (*row, *shared_params)],
                )
            # Ids grow in the order rows are inserted (both engines), whatever order RETURNING
            # reports them in.
            ids += sorted(row[0] for row in cursor.fetchall())
    if len(ids) != len(rows):
        raise RuntimeError(f"inserted {len(ids)} of {len(rows)} rows")
    return ids


class _Literals:
    """Values prepared for a MariaDB/MySQL statement as SQL text, exactly as the driver quotes a
    parameter (its own ``literal``), with the forms that need no quoting written directly (whole
    numbers, ``NULL``, booleans as the driver writes them, dates as the adapter wrote them: digits
    and ``-: .`` only) and each distinct text quoted once per statement batch."""

    def __init__(self, literal: Callable[[Any], bytes], encoding: str) -> None:
        self._literal = literal
        self._encoding = encoding
        self._quoted: dict[str, str] = {}

    @classmethod
    def of(cls, conn: Any) -> _Literals:
        conn.ensure_connection()
        raw = conn.connection
        return cls(raw.literal, raw.encoding)

    def text(self, value: Any) -> str:
        kind = type(value)
        if kind is int:
            return str(value)
        if value is None:
            return "NULL"
        if kind is bool:
            return "1" if value else "0"
        if isinstance(value, str):  # text choices (a status, a trigger) included
            quoted = self._quoted.get(value)
            if quoted is None:
                if _DATE_TEXT.fullmatch(value):
                    return f"'{value}'"
                quoted = self._quoted[value] = self.quote(value)
            return quoted
        return self.quote(value)

    def quote(self, value: Any) -> str:
        return self._literal(value).decode(self._encoding)


def insert_instances(objs: Sequence[models.Model]) -> None:
    """``bulk_create`` for new instances of one model with an automatic primary key: every
    concrete field prepared as ``save`` would (``auto_now`` stamps included), one statement per
    engine batch; each instance gets its id and is marked saved."""
    if not objs:
        return
    model = type(objs[0])
    meta = model._meta
    fields = [field for field in meta.concrete_fields if field is not meta.pk]
    # A field whose value goes in as it is read (no stamp of its own to take, no preparation)
    # is read from the instance's attributes directly: thirty fields a fire, and the calls per
    # field were a tenth of the leader's tick.
    steps = [
        (field.attname, None if _as_read(field) else (field, preparer(field))) for field in fields
    ]
    rows = [
        [
            values[attname] if step is None and attname in values else _value(obj, attname, step)
            for attname, step in steps
        ]
        for obj in objs
        for values in (vars(obj),)
    ]
    for obj, pk in zip(objs, insert(model, fields, rows), strict=True):
        obj.pk = pk
        obj._state.adding = False
        obj._state.db = connection.alias


def _as_read(field: models.Field) -> bool:
    """Whether ``field``'s value is stored as the instance holds it: a plain kind (no
    preparation), saved as read (``Field.pre_save``: no ``auto_now`` stamp)."""
    return (
        field.get_internal_type() in PLAIN_KINDS and type(field).pre_save is models.Field.pre_save
    )


def _value(obj: models.Model, attname: str, step: tuple[models.Field, Preparer] | None) -> Any:
    if step is None:
        return getattr(obj, attname)
    field, prepare = step
    return prepare(field.pre_save(obj, add=True))


def _inline(value: Any) -> str | None:
    """``value`` (prepared for the database) as SQL text when its type guarantees a safe form:
    whole numbers, finite floats, and dates as the engine's adapter wrote them (digits and
    ``-: .`` only). None for anything else, which stays a parameter."""
    kind = type(value)
    if kind is int:
        return str(value)
    if kind is float and math.isfinite(value):
        return repr(value)
    if kind is str and _DATE_TEXT.fullmatch(value):
        return f"'{value}'"
    return None


# A date or date-time as both engines' adapters write one ("2026-12-02 22:00:00.123456").
_DATE_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}( \d{2}:\d{2}:\d{2}(\.\d{1,6})?)?", re.ASCII)


def update(
    model: type[models.Model],
    rows: Sequence[tuple[int, dict[str, Any]]],
    columns: Sequence[str],
    *,
    where: str = "",
    where_params: Sequence[Any] = (),
) -> int:
    """One UPDATE setting ``columns`` (field names) of each row (pk, {field name: value}): a
    column whose values all agree is set to that one value, the others to a ``CASE`` on the id.
    ``where`` adds conditions (SQL over the model's columns, ``%s`` placeholders for
    ``where_params``) to ``id IN (...)``. Returns the rows matched.

    The ids, and the values that are numbers or dates, are written into the statement's text
    (``_inline``): the driver quoted each parameter with a Python call of its own, about 1 us
    each and ten a row for the finisher's outcomes. Text values stay parameters."""
    meta = model._meta
    quote = connection.ops.quote_name
    id_column = quote(meta.pk.column)
    ids = [str(int(pk)) for pk, _ in rows]
    assignments: list[str] = []
    params: list[Any] = []
    for name in columns:
        field = meta.get_field(name)
        prepare = preparer(field)
        first = rows[0][1][name]
        if all(values[name] is first for _, values in rows):
            # One value for every row (an outcome's stamp, an empty error): prepared once.
            assignments.append(f"{quote(field.column)} = %s")
            params.append(prepare(first))
            continue
        prepared = [prepare(values[name]) for _, values in rows]
        if all(value == prepared[0] for value in prepared):
            assignments.append(f"{quote(field.column)} = %s")
            params.append(prepared[0])
            continue
        cases = []
        for pk, value in zip(ids, prepared, strict=True):
            text = _inline(value)
            if text is None:
                cases.append(f"WHEN {pk} THEN %s")
                params.append(value)
            else:
                cases.append(f"WHEN {pk} THEN {text}")
        assignments.append(f"{quote(field.column)} = CASE {id_column} {' '.join(cases)} END")
    sql = (
        f"UPDATE {quote(meta.db_table)} SET {', '.join(assignments)} "  # noqa: S608 (see above)
        f"WHERE {id_column} IN ({', '.join(ids)}){f' AND {where}' if where else ''}"
    )
    params += list(where_params)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount
