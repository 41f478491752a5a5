import logging
import threading
from typing import Any

from django.apps import AppConfig

logger = logging.getLogger(__name__)


# Seconds; set by runnode (node processes only: a web request or a test may legitimately sit in
# a transaction longer, and only nodes take the locks that hold the cluster up).
_idle_transaction_limit_s: int = 0


def limit_idle_transactions(seconds: int) -> None:
    """Apply the MariaDB idle-transaction timeout to every connection this process opens from now."""
    global _idle_transaction_limit_s
    _idle_transaction_limit_s = int(seconds)


def _limit_idle_write_transactions(sender, connection, **kwargs) -> None:
    """MariaDB only (MySQL has no such variable): see SCHEDULER_IDLE_TRANSACTION_TIMEOUT_S."""
    timeout = _idle_transaction_limit_s
    if connection.vendor != "mysql" or not timeout or not connection.mysql_is_mariadb:
        return
    with connection.cursor() as cursor:
        # idle_transaction_timeout, not idle_write_transaction_timeout: a transaction that has only
        # taken row locks (SELECT ... FOR UPDATE) does not count as a write one, yet blocks others.
        cursor.execute("SET SESSION idle_transaction_timeout = %s", [int(timeout)])


def _log_new_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    """DEBUG: which thread opened a database connection (a node's connection budget)."""
    logger.debug("database connection opened by thread %s", threading.current_thread().name)


class ClusterConfig(AppConfig):
    name = "cluster"
    verbose_name = "Cluster"

    def ready(self) -> None:
        from django.core import checks

        checks.register(check_scheduler_knobs, checks.Tags.compatibility)
        from django.db.backends.signals import connection_created

        from cluster.dbhealth import apply_limits

        connection_created.connect(_limit_idle_write_transactions, dispatch_uid="cluster-idle-tx")
        connection_created.connect(apply_limits, dispatch_uid="cluster-control-limits")
        connection_created.connect(_log_new_connection, dispatch_uid="cluster-log-connection")

        from cluster import announce

        announce.connect()


def check_scheduler_knobs(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """``manage.py check`` (and every command that runs the checks): a wrong ``SCHEDULER`` knob
    as one line naming it, not a traceback."""
    from django.core import checks
    from django.core.exceptions import ImproperlyConfigured

    from cluster import conf

    try:
        conf.knobs()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="cluster.E001")]
    return []
