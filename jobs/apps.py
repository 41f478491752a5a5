from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        from django.conf import settings

        from jobs import registry

        registry.autodiscover()
        if getattr(settings, "SCHEDULER_DEMO_TASKS", False):
            # The demo set registers itself on import (it uses the registry, not the other way).
            from jobs import demo_tasks  # noqa: F401
