"""Benchmark peer (docs/benchmarks.md): Celery beat + celery-redbeat + a Celery worker on one Redis."""
