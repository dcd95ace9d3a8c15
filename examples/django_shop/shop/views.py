from django.db import transaction
from django.db.models import F
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from .models import Order, Product
from .tasks import send_receipt


class OutOfStock(Exception):
    pass


def home(request):
    return render(
        request, "shop/home.html", {"products": Product.objects.all(), "orders": Order.objects.order_by("-id")[:10]}
    )


@require_POST
def place_order(request):
    product = get_object_or_404(Product, pk=request.POST["product"])
    quantity = int(request.POST["quantity"])
    try:
        with transaction.atomic():
            order = Order.objects.create(customer=request.POST["customer"], product=product, quantity=quantity)
            # Written in this transaction: the receipt's job exists exactly when the order does.
            order.receipt_task = send_receipt.enqueue(order.id).id
            order.save(update_fields=["receipt_task"])
            taken = Product.objects.filter(pk=product.pk, stock__gte=quantity).update(stock=F("stock") - quantity)
            if not taken:
                raise OutOfStock(product.name)
    except OutOfStock as exc:
        return render(
            request,
            "shop/home.html",
            {
                "products": Product.objects.all(),
                "error": f"not enough {exc}",
                "orders": Order.objects.order_by("-id")[:10],
            },
            status=409,
        )
    return redirect("receipt", order_id=order.id)


def receipt(request, order_id: int):
    order = get_object_or_404(Order, pk=order_id)
    result = send_receipt.get_result(order.receipt_task)
    answer = {
        "order": order.id,
        "status": result.status,
        "attempts": result.attempts,
        "enqueued_at": result.enqueued_at.isoformat(),
    }
    if result.is_finished and not result.errors:
        answer["receipt"] = result.return_value
    return JsonResponse(answer)
