from django.apps import AppConfig


class JobQueueConfig(AppConfig):
    """INSTALLED_APPS = [..., "jobqueue.django"]: the `jobqueue_worker` command and the checks."""

    name = "jobqueue.django"
    label = "jobqueue"
    verbose_name = "Job queue"
