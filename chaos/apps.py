from django.apps import AppConfig


class ChaosConfig(AppConfig):
    """The verifier: ``manage.py chaos`` drives a cluster of real nodes from outside and checks what
    happened. Nothing of it runs on a node; a project adds it to ``INSTALLED_APPS`` to get the
    command."""

    name = "chaos"
    verbose_name = "Chaos verifier"
