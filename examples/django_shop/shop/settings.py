"""A small Django shop on MySQL/MariaDB whose tasks run on the job queue (examples/django_shop).

SHOP_DATABASE_URL: mysql://user:password@host:port/database (default: the local MariaDB's
django_shop database)."""

import os
from urllib.parse import unquote, urlsplit

import django
import pymysql

pymysql.install_as_MySQLdb()  # Django's MySQL backend on PyMySQL, the queue's driver

url = urlsplit(os.environ.get("SHOP_DATABASE_URL", "mysql://root@127.0.0.1:3306/django_shop"))

SECRET_KEY = os.environ.get("SHOP_SECRET_KEY", "django-shop-example-not-secret")
DEBUG = os.environ.get("SHOP_DEBUG", "") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "jobqueue.django",
    "shop",
]
if django.VERSION < (6, 0):
    INSTALLED_APPS.append("django_tasks")  # the backport of django.tasks

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "shop.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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
WSGI_APPLICATION = "shop.wsgi.application"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.mysql",
        "NAME": url.path.lstrip("/"),
        "USER": unquote(url.username or ""),
        "PASSWORD": unquote(url.password or ""),
        "HOST": url.hostname or "127.0.0.1",
        "PORT": str(url.port or 3306),
        "OPTIONS": {"charset": "utf8mb4"},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

TASKS = {
    "default": {
        "BACKEND": "jobqueue.django.JobQueueBackend",
        "QUEUES": ["default", "receipts"],
        "OPTIONS": {"DATABASE": "default", "MAX_ATTEMPTS": 3},
    }
}
STATIC_URL = "static/"
LOGIN_URL = "admin:login"
