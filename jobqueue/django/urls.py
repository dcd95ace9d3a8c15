"""path("jobs-admin/", include("jobqueue.django.urls")): the dashboard (see dashboard.py)."""

from django.urls import re_path

from .dashboard import dashboard

urlpatterns = [re_path(r"^(?P<rest>.*)$", dashboard, name="jobqueue-dashboard")]
