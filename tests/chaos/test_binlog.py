"""Reading which term wrote what, in commit order, from MariaDB's row-based binary log (the text
``mariadb-binlog -v`` prints, as a private server wrote it)."""

from __future__ import annotations

from chaos.binlog import commits, parse

COLUMNS = {
    "cluster_clusterfence": ["name", "term", "holder", "writes", "writer_term"],
    "jobs_jobexecution": ["id", "status", "trigger", "reason", "term"],
    "jobs_job": ["id", "name"],
}


def fence_update(before: tuple, after: tuple) -> str:
    rows = "\n".join(
        f"###   @{i}={v!r}" if isinstance(v, str) else f"###   @{i}={v}"
        for i, v in enumerate(before, 1)
    )
    rows_after = "\n".join(
        f"###   @{i}={v!r}" if isinstance(v, str) else f"###   @{i}={v}"
        for i, v in enumerate(after, 1)
    )
    return f"### UPDATE `chaos`.`cluster_clusterfence`\n### WHERE\n{rows}\n### SET\n{rows_after}\n"


LOG = f"""# at 950
#261204  2:12:48 server id 1  end_log_pos 992 CRC32 0x62eb124d 	GTID 0-1-4 trans
START TRANSACTION
/*!*/;
#Q> update cluster_clusterfence set term=2, holder='t n2' where name='leader'
{fence_update(("leader", 1, "t n1", 7, 1), ("leader", 2, "t n2", 7, 1))}# Number of rows: 1
COMMIT/*!*/;
START TRANSACTION
{fence_update(("leader", 2, "t n2", 7, 1), ("leader", 2, "t n2", 8, 1))}\
### INSERT INTO `chaos`.`jobs_jobexecution`
### SET
###   @1=41
###   @2='pending'
###   @3='schedule'
###   @4='it's a "q"\\x0aline'
###   @5=1
### INSERT INTO `chaos`.`jobs_jobexecution`
### SET
###   @1=42
###   @2='skipped'
###   @3='schedule'
###   @4='misfire'
###   @5=1
### UPDATE `chaos`.`jobs_jobexecution`
### WHERE
###   @1=30
###   @2='running'
###   @3='schedule'
###   @4=''
###   @5=1
### SET
###   @1=30
###   @2='lost'
###   @3='schedule'
###   @4='node n3 is gone'
###   @5=1
COMMIT/*!*/;
START TRANSACTION
### UPDATE `chaos`.`jobs_job`
### WHERE
###   @1=1
###   @2='a'
### SET
###   @1=1
###   @2='b'
COMMIT/*!*/;
START TRANSACTION
### INSERT INTO `chaos`.`jobs_jobexecution`
### SET
###   @1=43
###   @2='pending'
###   @3='schedule'
###   @4=''
###   @5=NULL
COMMIT/*!*/;
"""


def test_the_log_reads_as_transactions_in_commit_order() -> None:
    transactions = parse(LOG, COLUMNS)
    assert [len(t) for t in transactions] == [1, 4, 1, 1]
    insert = transactions[1][1]
    assert (insert.op, insert.after["id"], insert.after["reason"]) == (
        "insert",
        41,
        'it\'s a "q"\\x0aline',
    )
    lost = transactions[1][3]
    assert (lost.before["status"], lost.after["status"]) == ("running", "lost")
    assert transactions[3][0].after["term"] is None


def test_each_commit_names_its_writer_and_what_it_did() -> None:
    found = commits(parse(LOG, COLUMNS))
    raise_, write, unfenced = found  # the job edit touched neither the fence nor the runs
    assert (raise_.seq, raise_.raised_to, raise_.writer_term) == (0, 2, None)
    assert (write.writer_term, write.fence_term, write.raised_to) == (1, 2, None)
    assert (write.fires, write.skipped, write.lost, write.retries) == (2, 1, 1, 0)
    assert write.execution_ids == [41, 42, 30]
    assert (unfenced.seq, unfenced.writer_term, unfenced.fires) == (3, None, 1)
