"""What the hot path (claims, outcomes, enqueued runs) asks of the database driver, on
MariaDB/MySQL: every round trip there costs the node about 40 us of CPU and the server about 35
us on the 2-core machine (a loopback TCP exchange each way), and a node makes thousands a second
in a burst.

- ``Transaction``: a transaction whose ``BEGIN`` travels with its first statement and whose
  ``COMMIT`` with its last (mysqlclient sends several statements in one call: its
  ``multi_statements`` is on by default). Django's ``atomic()`` costs three round trips of its own
  (``SET autocommit=0``, ``COMMIT``, ``SET autocommit=1``); this one costs none.
- DATETIME values parsed in C: mysqlclient parses each with a Python function (1.1 us a value,
  seven per execution row); ``datetime.fromisoformat`` takes 0.06 us. Installed on every
  connection as it opens (``install_fast_datetimes``, a ``connection_created`` receiver).

On SQLite (one process's file, no network) both are the plain Django ways.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from django.db import connection, transaction

_COMMIT = "; COMMIT"


class Transaction:
    """One transaction of the hot path, opened by ``transaction_script``. Statements go through
    ``execute``; the last one through ``execute_and_commit``. Code inside must not open an
    ``atomic()`` block nor count on ``transaction.on_commit`` (on MariaDB Django does not know a
    transaction is open: a callback would run at once, before the commit): callers announce
    after the block."""

    def __init__(self, cursor: Any, *, inline: bool) -> None:
        self.cursor = cursor
        # BEGIN and COMMIT sent with the statements (MariaDB), or left to atomic() (SQLite, or a
        # caller's transaction).
        self.inline = inline
        self._begun = False
        self.committed = False

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run ``sql`` in the transaction; returns the cursor, on the statement's result."""
        if self.inline and not self._begun:
            self._begun = True
            self.cursor.execute(f"BEGIN; {sql}", params)
            self._next_result()
        else:
            self.cursor.execute(sql, params)
        return self.cursor

    def execute_and_commit(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run the transaction's last statement and commit; returns the rows it matched."""
        if not self.inline:
            self.execute(sql, params)
            return self.cursor.rowcount
        if not self._begun:
            # A single statement is its own transaction.
            self.cursor.execute(sql, params)
            self.committed = True
            return self.cursor.rowcount
        self.cursor.execute(f"{sql}{_COMMIT}", params)
        matched = self.cursor.rowcount
        self._next_result()  # the COMMIT's: raises if the commit failed
        self.committed = True
        return matched

    def rollback(self) -> None:
        if self.inline and self._begun and not self.committed:
            try:
                self.cursor.execute("ROLLBACK")
            except Exception:
                # A connection whose transaction may still be open (and hold row locks) is not
                # used again: closed, the server ends the transaction.
                connection.close()

    def _next_result(self) -> None:
        with connection.wrap_database_errors:
            self.cursor.cursor.nextset()


@contextlib.contextmanager
def transaction_script() -> Iterator[Transaction]:
    """A ``Transaction``: on MariaDB/MySQL outside any ``atomic()`` block, sent with its
    statements; elsewhere an ``atomic()`` block. Leaving the block without ``execute_and_commit``
    rolls back on MariaDB (nothing was written then) and commits what the block did elsewhere."""
    inline = connection.vendor == "mysql" and not connection.in_atomic_block
    if not inline:
        with transaction.atomic(), connection.cursor() as cursor:
            yield Transaction(cursor, inline=False)
        return
    with connection.cursor() as cursor:
        script = Transaction(cursor, inline=True)
        try:
            yield script
        finally:
            script.rollback()


def _datetime_or_none(value: str) -> datetime | None:
    """A DATETIME as mysqlclient returns it (naive), parsed in C; the driver's own function for
    what ``fromisoformat`` refuses (zero dates, which it turns into None)."""
    try:
        return datetime.fromisoformat(value)
    except (TypeError, ValueError):
        from MySQLdb.times import DateTime_or_None

        return DateTime_or_None(value)


def install_fast_datetimes(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created`` receiver: DATETIME and TIMESTAMP values of this (MariaDB/MySQL)
    connection are parsed by ``_datetime_or_none``."""
    if connection.vendor != "mysql":
        return
    from MySQLdb.constants import FIELD_TYPE

    converters = connection.connection.converter
    converters[FIELD_TYPE.DATETIME] = _datetime_or_none
    converters[FIELD_TYPE.TIMESTAMP] = _datetime_or_none
