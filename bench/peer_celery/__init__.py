"""Benchmark peer (DESIGN §7): Celery beat + celery-redbeat + a Celery worker on one Redis."""
