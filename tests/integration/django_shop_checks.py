"""Run inside examples/django_shop (`manage.py shell -c "import runpy; runpy.run_path(PATH)"`), on
whichever Django the interpreter has (5.2 + the django-tasks backport, or 6.x): the backend's
contract against a real server, the shop's views and the dashboard behind Django's login.
tests/integration/test_django_shop.py runs it; any failed assert exits non-zero."""

import asyncio
import re
from datetime import timedelta

import django
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

settings.ALLOWED_HOSTS.append("testserver")
settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # tests only: fast logins
settings.TASKS["default"]["OPTIONS"]["RETRY_BASE_SECONDS"] = 0.05  # before the backend is made

from shop.models import Order, Product  # noqa: E402
from shop.tasks import add, always_fails, attempt_report, send_receipt  # noqa: E402

from jobqueue.core.db import create_engine  # noqa: E402
from jobqueue.core.worker import Worker, WorkerConfig  # noqa: E402
from jobqueue.django.backend import JobQueueBackend  # noqa: E402
from jobqueue.django.connection import database_url  # noqa: E402
from jobqueue.django.framework import TaskResultDoesNotExist, TaskResultStatus, task_backends  # noqa: E402

print("django", django.get_version(), "framework", TaskResultStatus.__module__)
engine = create_engine(database_url("default"), pool_size=4)


def run_worker() -> None:
    assert Worker(engine, WorkerConfig(concurrency=2, burst=True, idle_cap_seconds=0.1)).run() == 0


def jobs() -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT task_key, task_name, queue, priority, status FROM job_queue ORDER BY id")
        return list(cursor.fetchall())


backend = task_backends["default"]
assert isinstance(backend, JobQueueBackend)
assert (
    backend.supports_defer,
    backend.supports_async_task,
    backend.supports_get_result,
    backend.supports_priority,
) == (True, True, True, True)

# --- enqueue in an atomic block: the job exists exactly when the block commits -----------------
order = Order.objects.create(customer="Ada", product_id=1, quantity=1)
try:
    with transaction.atomic():
        doomed = send_receipt.enqueue(order.id)
        assert send_receipt.get_result(doomed.id).status == TaskResultStatus.READY  # read your own write
        raise KeyError("rolled back on purpose")
except KeyError:
    pass
assert jobs() == []
try:
    send_receipt.get_result(doomed.id)
    raise AssertionError("a rolled-back task has a result")
except TaskResultDoesNotExist:
    pass

with transaction.atomic():
    kept = send_receipt.enqueue(order.id)
    with transaction.atomic():  # a nested block's enqueue rolls back with it, alone
        inner = add.enqueue(1, 1)
        transaction.set_rollback(True)
assert [row[0] for row in jobs()] == [kept.id]
assert kept.status == TaskResultStatus.READY and kept.enqueued_at is not None and kept.args == [order.id]
assert (kept.task.priority, kept.task.queue_name) == (10, "receipts")
assert jobs()[0][1:] == ("shop.tasks.send_receipt", "receipts", -10, "ready")  # larger Django priority: claimed first

# --- the other features ----------------------------------------------------------------------
later = timezone.now() + timedelta(hours=1)
deferred = add.using(run_after=later, priority=-5).enqueue(2, b=3)
got = add.get_result(deferred.id)
assert got.status == TaskResultStatus.READY and abs(got.task.run_after - later) < timedelta(seconds=1)
assert (got.task.priority, got.args, got.kwargs) == (-5, [2], {"b": 3})
summed = add.enqueue(20, 22)
context = attempt_report.enqueue("ctx")
failing = always_fails.enqueue("no such thing")
tupled = attempt_report.enqueue(("a", "b"))  # stored as Django serialises it: a list
assert add.get_result(deferred.id).task.run_after == got.task.run_after


async def async_api():
    made = await add.aenqueue(1, 2)
    again = await add.aget_result(made.id)
    return made, again


made, again = asyncio.run(async_api())
assert again.id == made.id and again.status == TaskResultStatus.READY

for _ in range(40):  # retries wait out a short backoff (RETRY_BASE_SECONDS)
    run_worker()
    if always_fails.get_result(failing.id).status == TaskResultStatus.FAILED:
        break

done = send_receipt.get_result(kept.id)
assert done.status == TaskResultStatus.SUCCESSFUL, done.status
assert done.return_value == {"order": order.id, "to": "Ada", "total_cents": 2500}
assert done.enqueued_at <= done.started_at == done.last_attempted_at <= done.finished_at
assert done.attempts == 1 and len(done.worker_ids) == 1 and done.errors == []
assert add.get_result(summed.id).return_value == 42  # an async def task
assert add.get_result(made.id).return_value == 3
assert add.get_result(deferred.id).status == TaskResultStatus.READY  # not due for an hour
report = attempt_report.get_result(context.id).return_value
assert report == {"label": "ctx", "attempt": 1, "result_id": context.id}, report
assert attempt_report.get_result(tupled.id).return_value["label"] == ["a", "b"]

failed = always_fails.get_result(failing.id)
assert failed.status == TaskResultStatus.FAILED and failed.attempts == 3 and len(failed.worker_ids) == 3
assert [e.exception_class_path for e in failed.errors] == ["builtins.LookupError"] * 3
assert failed.errors[0].exception_class is LookupError
assert failed.errors[-1].traceback.startswith("Traceback (most recent call last):")
assert "no such thing" in failed.errors[-1].traceback and failed.finished_at is not None
try:
    _ = failed.return_value
    raise AssertionError("a failed task has a return value")
except ValueError:
    pass

# --- the shop's views --------------------------------------------------------------------------
shopper = Client()
placed = shopper.post("/orders", {"customer": "Grace", "product": "1", "quantity": "2"})
assert placed.status_code == 302, placed.status_code
new_order = Order.objects.get(customer="Grace")
assert shopper.get(placed["Location"]).json()["status"] == "READY"
before = len(jobs())
refused = shopper.post("/orders", {"customer": "Linus", "product": "1", "quantity": "5"})  # 1 teapot left
assert refused.status_code == 409 and b"not enough teapot" in refused.content
assert not Order.objects.filter(customer="Linus").exists() and len(jobs()) == before  # no order, no job
assert Product.objects.get(pk=1).stock == 1
run_worker()
answer = shopper.get(f"/orders/{new_order.id}/receipt").json()
assert answer["status"] == "SUCCESSFUL" and answer["receipt"]["total_cents"] == 5000, answer

# --- the dashboard behind Django's admin login -------------------------------------------------
User.objects.create_superuser("ada", password="pw-ada-1")
User.objects.create_user("vic", password="pw-vic-1", is_staff=True)
User.objects.create_user("carl", password="pw-carl-1")
anonymous = Client().get("/jobs-admin/jobs")
assert anonymous.status_code == 302 and anonymous["Location"] == "/admin/login/?next=/jobs-admin/jobs", anonymous[
    "Location"
]
customer = Client()
customer.login(username="carl", password="pw-carl-1")
assert customer.get("/jobs-admin/").status_code == 403
viewer = Client()
viewer.login(username="vic", password="pw-vic-1")
page = viewer.get("/jobs-admin/jobs")
assert page.status_code == 200 and kept.id in page.content.decode() and "vic (viewer)" in page.content.decode()
assert viewer.get("/jobs-admin/static/app.css").status_code == 200
admin = Client()
admin.login(username="ada", password="pw-ada-1")
html = admin.get("/jobs-admin/jobs?task=shop.tasks.add").content.decode()
token = re.search(r'"X-CSRFToken": "([^"]+)"', html).group(1)
with connection.cursor() as cursor:
    cursor.execute("SELECT id FROM job_queue WHERE task_key = %s", [deferred.id])
    (deferred_job,) = cursor.fetchone()
forged = admin.post(f"/jobs-admin/jobs/{deferred_job}/cancel", {"confirm": "yes"})
assert forged.status_code == 400  # the dashboard's own CSRF check
cancelled = admin.post(
    f"/jobs-admin/jobs/{deferred_job}/cancel", {"confirm": "yes"}, headers={"X-CSRFToken": token, "HX-Request": "true"}
)
assert cancelled.status_code == 200, cancelled.status_code
assert add.get_result(deferred.id).status == TaskResultStatus.FAILED  # cancelled: FAILED, no error
with connection.cursor() as cursor:
    cursor.execute("SELECT actor FROM audit_log WHERE job_id = %s", [deferred_job])
    assert cursor.fetchall() == (("web:ada",),)
assert viewer.post(
    f"/jobs-admin/jobs/{deferred_job}/requeue", {"confirm": "yes"}, headers={"X-CSRFToken": token}
).status_code in (400, 403)
engine.dispose()
print("django shop checks passed")
