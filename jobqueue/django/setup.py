"""`jobqueue worker --tasks jobqueue.django.setup`: the plain worker command, in a process where
Django is set up from DJANGO_SETTINGS_MODULE (manage.py jobqueue_worker does the same)."""

from .worker import setup

setup()
