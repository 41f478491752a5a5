"""Every write of a JobExecution, in this package and nowhere else.

Each status change is checked against the state machine (``jobs.states``) and is one conditional
UPDATE on the status it leaves and, where the writer holds one, its claim token: a stale writer
matches no row and changes nothing. Each announces itself after commit (``jobs.events``), so nobody
sees a state the database rolled back. Callers own the transactions: a function here either runs in
the caller's transaction or, where it says so, opens its own.

- ``transitions``: creation, starting, skipping, finishing, ending, retries, cancels;
- ``claims``: the claim's SQL and the hand-backs of claimed, unstarted runs;
- ``rows``: the hot path's row loader and job cache.

Callers use the names below (``from jobs import executions``; ``executions.claim_batch(...)``).
"""

from jobs.executions.claims import (
    CLAIM_CANDIDATES_FACTOR,
    claim_batch,
    claim_prefix_of,
    hand_back,
    hand_back_claims,
    hand_back_nodes,
    hand_back_unstarted,
    new_claim_prefix,
    still_running_here,
)
from jobs.executions.rows import attach_jobs, load_rows, select_rows
from jobs.executions.transitions import (
    ENQUEUE_SLOT_MARGIN,
    ERROR_MAX_CHARS,
    FINISH_STATEMENT_CHARS,
    OUTCOME_COLUMNS,
    REASON_MAX_CHARS,
    RESULT_MAX_CHARS,
    announce,
    announce_many,
    backoff_delay,
    bounded_text,
    cancel_waiting,
    create_enqueued,
    create_fires,
    create_manual_run,
    create_retry_if_allowed,
    create_retry_now,
    declare_lost,
    end_running,
    finish,
    finish_batch,
    jsonable_result,
    new_fire,
    promote_due_retries,
    purge_finished,
    request_cancel,
    request_cancel_jobs,
    save_output_so_far,
    skip,
    start_batch,
    transition,
)

__all__ = [
    "CLAIM_CANDIDATES_FACTOR",
    "ENQUEUE_SLOT_MARGIN",
    "ERROR_MAX_CHARS",
    "FINISH_STATEMENT_CHARS",
    "OUTCOME_COLUMNS",
    "REASON_MAX_CHARS",
    "RESULT_MAX_CHARS",
    "announce",
    "announce_many",
    "attach_jobs",
    "backoff_delay",
    "bounded_text",
    "cancel_waiting",
    "claim_batch",
    "claim_prefix_of",
    "create_enqueued",
    "create_fires",
    "create_manual_run",
    "create_retry_if_allowed",
    "create_retry_now",
    "declare_lost",
    "end_running",
    "finish",
    "finish_batch",
    "hand_back",
    "hand_back_claims",
    "hand_back_nodes",
    "hand_back_unstarted",
    "jsonable_result",
    "load_rows",
    "new_claim_prefix",
    "new_fire",
    "promote_due_retries",
    "purge_finished",
    "request_cancel",
    "request_cancel_jobs",
    "save_output_so_far",
    "select_rows",
    "skip",
    "start_batch",
    "still_running_here",
    "transition",
]
