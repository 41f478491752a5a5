from jobs.registry import task
from shop.models import Order


@task("shop.count_orders")
def count_orders() -> int:
    """Count the shop's orders (a task using the host's own model)."""
    return Order.objects.count()
