"""The shop's tasks: Django's own @task decorator; the job queue's workers run them."""

try:
    from django.tasks import task  # Django 6
except ImportError:
    from django_tasks import task  # Django 5.2 LTS: the backport

from .models import Order


@task(queue_name="receipts", priority=10)
def send_receipt(order_id: int) -> dict:
    order = Order.objects.select_related("product").get(pk=order_id)
    total = order.quantity * order.product.price_cents
    return {"order": order.id, "to": order.customer, "total_cents": total}


@task(takes_context=True)
def attempt_report(context, label: str) -> dict:
    return {"label": label, "attempt": context.attempt, "result_id": context.task_result.id}


@task
async def add(a: int, b: int) -> int:
    return a + b


@task
def always_fails(message: str) -> None:
    raise LookupError(message)
