import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")
application = get_wsgi_application()

from cluster.startup import freeze_loaded  # noqa: E402

freeze_loaded()
