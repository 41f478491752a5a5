from jobs.registry import task
from shop.models import Order


@task("shop.count_orders")
def count_orders() -> int:
    """Record a tally of the shop's orders (a task writing the host's own model)."""
    count = Order.objects.exclude(reference__startswith="tally-").count()
    Order.objects.create(reference=f"tally-{count}")
    return count
