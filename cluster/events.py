"""In-process notifications of the cluster's own rows, always sent after the transaction commits
(as ``jobs.events`` does for jobs and runs): a node registered, beat after a silence, drained or
was declared dead; a term began or ended. ``cluster.services`` sends them; ``cluster.announce``
tells the other processes (the live feed's doorbell)."""

from __future__ import annotations

from django.dispatch import Signal

# kwargs: kind ("node" or "term"), key (the node id, or the term number as a string), change
# (registered, rejoined, stopped, dead, drain_requested, forgotten; began, ended, relabelled).
cluster_changed = Signal()
