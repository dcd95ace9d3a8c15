from django.contrib import admin
from django.urls import include, path

from . import views

urlpatterns = [
    path("", views.home, name="home"),
    path("orders", views.place_order, name="place-order"),
    path("orders/<int:order_id>/receipt", views.receipt, name="receipt"),
    path("admin/", admin.site.urls),
    path("jobs-admin/", include("jobqueue.django.urls")),  # staff only: Django's admin login
]
