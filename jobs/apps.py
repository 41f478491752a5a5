from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from jobs import driver, registry
        from jobs.conf import app_setting

        connection_created.connect(driver.install_fast_datetimes, dispatch_uid="jobs-datetimes")

        registry.autodiscover()
        if app_setting("SCHEDULER_DEMO_TASKS"):
            # The demo set registers itself on import (it uses the registry, not the other way).
            from jobs import demo_tasks  # noqa: F401
