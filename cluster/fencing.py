"""Fencing in storage: a leader's writes land only while no newer term has been recorded.

A term number only helps if storage checks it. A new leader first raises the fence row to its term;
every leader write then runs inside ``fenced_transaction(term)``, which locks the fence row and aborts
if the stored term is newer than the writer's. A leader frozen past its lease (SIGSTOP, a long GC, a
lost network) and then resumed finds a newer term there and changes nothing.

Lock order: the fence row is always locked first, before any job or execution row, so leader writes
and a new leader's fence raise cannot deadlock.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import IntegrityError, transaction
from django.db.models import F

from cluster.models import ClusterFence

logger = logging.getLogger(__name__)

FENCE_NAME = "leader"
ERR_FENCED = "term {term} is fenced: storage has already seen term {current}"


class Fenced(Exception):
    """The writer's term is older than the newest term storage has seen: it is stale."""

    def __init__(self, term: int, current: int) -> None:
        super().__init__(ERR_FENCED.format(term=term, current=current))
        self.term = term
        self.current = current


def _ensure_fence_row(fence: str) -> None:
    if not ClusterFence.objects.filter(name=fence).exists():
        try:
            with transaction.atomic():
                ClusterFence.objects.create(name=fence, term=0)
        except IntegrityError:
            pass  # another node created it first


def fence_raise(term: int, holder: str, *, fence: str = FENCE_NAME) -> bool:
    """Record ``term``, held by ``holder``, as the newest. False if storage has already seen a
    newer term, or this very term held by another holder: a term is never minted twice, so a
    coordination store that restarted without its counter cannot hand out a term again.

    ``holder`` names one tenure, not just a node (see ``tenure``): the same node winning the
    restarted store's counter again gets the term it held before, and must be refused too."""
    _ensure_fence_row(fence)
    with transaction.atomic():
        stored, stored_holder = (
            ClusterFence.objects.select_for_update()
            .filter(name=fence)
            .values_list("term", "holder")
            .get()
        )
        if stored > term or (stored == term and stored_holder not in ("", holder)):
            return False
        if stored < term:
            ClusterFence.objects.filter(name=fence).update(term=term, holder=holder)
    return True


def tenure(node_id: str, lease_token: str) -> str:
    """The fence's holder for one acquisition of the lease: its token first (unique per
    acquisition), then the node for the reader; within the column's 128 characters."""
    return f"{lease_token} {node_id}"[:128]


def fence_current(fence: str = FENCE_NAME) -> int:
    return ClusterFence.objects.filter(name=fence).values_list("term", flat=True).first() or 0


@contextmanager
def fenced_transaction(term: int, *, fence: str = FENCE_NAME) -> Iterator[None]:
    """A transaction that commits only if ``term`` is still the newest term of ``fence`` (each
    scheduling partition has its own: cluster.partitions), else raises Fenced."""
    with transaction.atomic():
        stored = (
            ClusterFence.objects.select_for_update()
            .filter(name=fence)
            .values_list("term", flat=True)
            .first()
        )
        if stored is not None and stored > term:
            raise Fenced(term, stored)
        ClusterFence.objects.filter(name=fence).update(writes=F("writes") + 1, writer_term=term)
        yield
