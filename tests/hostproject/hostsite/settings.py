"""The settings of a shop that adds the scheduler to the project it already has: its own apps, its
own database, and the scheduler's three apps from the installed package."""

import os
from pathlib import Path

from jobs.api.settings import SPECTACULAR_SETTINGS, rest_framework

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "host-project-test-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "hostsite.urls"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "dashboard",
    "rest_framework",
    "rest_framework.authtoken",  # a migration of jobs moves its keys into jobs.ApiToken
    "django_filters",
    "drf_spectacular",
    "channels",
    "jobs",
    "cluster",
    "shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("HOST_DB", str(BASE_DIR / "shop.sqlite3")),
    }
}
STATIC_URL = "/static/"
LOGIN_URL = "login"

# The scheduler's API (under ops/scheduler/api/, see urls.py) with its own DRF settings.
REST_FRAMEWORK = rest_framework()
SPECTACULAR_SETTINGS = {**SPECTACULAR_SETTINGS, "TITLE": "Shop scheduler API"}

# The scheduler: a few node knobs (the rest are their defaults); coordination in the shop's own
# database (the default).
SCHEDULER = {"CAPACITY": 4, "QUEUES": "default,reports"}
