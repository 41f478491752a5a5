"""What a long-lived process (a node, a web server) does once it has loaded everything it serves
with."""

from __future__ import annotations

import gc


def freeze_loaded() -> None:
    """Move everything loaded so far out of the garbage collector's sight.

    Django, the apps, the URL configuration and the views live as long as the process; a full
    collection walked all of them (40-90 ms on the 2-core machine), and one comes along every so
    often under a steady stream of allocations: in a node every body waited for it, in a web
    process the request that triggered it (an enqueue of 1,000 runs did). Objects created from
    now on are collected as before."""
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 - imports the URL configuration and its views now
    gc.collect()
    gc.freeze()
