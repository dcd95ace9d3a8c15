from django.db import models


class Product(models.Model):
    name = models.CharField(max_length=100)
    price_cents = models.PositiveIntegerField()
    stock = models.PositiveIntegerField()


class Order(models.Model):
    customer = models.CharField(max_length=100)
    product = models.ForeignKey(Product, on_delete=models.PROTECT)
    quantity = models.PositiveIntegerField()
    receipt_task = models.CharField(max_length=64, blank=True)  # the send_receipt TaskResult's id
