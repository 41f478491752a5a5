"""Stale writes judged by commit order (a private MariaDB's binary log, ``chaos.binlog``),
not by the writer's timestamp: walking the committed transactions in order,

- a fenced transaction whose writer's term is older than a term the fence had already been raised
  to, by an earlier commit, is a stale write, whatever it wrote (fires, lost declarations, skips,
  retries) — the fence must have refused it;
- a scheduled fire committed outside any fenced transaction is one too (nothing checked its term).
"""

from __future__ import annotations

from dataclasses import asdict

from chaos.record import History, Violation

STALE_COMMIT = "stale_commit"
KINDS = (STALE_COMMIT,)
MSG_STALE = (
    "commit #{seq} by term {writer} after the fence had reached term {newest} "
    "(commit #{raised_by}): {what}"
)
MSG_UNFENCED = "commit #{seq} wrote {fires} scheduled fires outside a fenced transaction"


def _what(commit) -> str:
    parts = [
        f"{count} {name}"
        for count, name in (
            (commit.fires, "fires"),
            (commit.lost, "lost declarations"),
            (commit.skipped, "skips"),
            (commit.retries, "retries"),
        )
        if count
    ]
    return ", ".join(parts) or "the fence only"


def stale_commits(history: History) -> list[Violation]:
    newest, raised_by = 0, -1
    found = []
    for commit in sorted(history.commits, key=lambda c: c.seq):
        if commit.writer_term is not None and commit.writer_term < newest:
            found.append(
                Violation(
                    STALE_COMMIT,
                    MSG_STALE.format(
                        seq=commit.seq,
                        writer=commit.writer_term,
                        newest=newest,
                        raised_by=raised_by,
                        what=_what(commit),
                    ),
                    {"commit": asdict(commit)},
                )
            )
        elif commit.writer_term is None and commit.fires:
            found.append(
                Violation(
                    STALE_COMMIT,
                    MSG_UNFENCED.format(seq=commit.seq, fires=commit.fires),
                    {"commit": asdict(commit)},
                )
            )
        if commit.raised_to is not None and commit.raised_to > newest:
            newest, raised_by = commit.raised_to, commit.seq
    return found
