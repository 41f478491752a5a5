from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        from django.conf import settings
        from django.db.backends.signals import connection_created

        from jobs import driver, registry

        connection_created.connect(driver.install_fast_datetimes, dispatch_uid="jobs-datetimes")

        registry.autodiscover()
        if getattr(settings, "SCHEDULER_DEMO_TASKS", False):
            # The demo set registers itself on import (it uses the registry, not the other way).
            from jobs import demo_tasks  # noqa: F401
