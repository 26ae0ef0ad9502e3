"""URLs: the three order endpoints and a health check (see :mod:`orders.views`)."""

from django.urls import path
from orders import views

urlpatterns = [
    path("health", views.health),
    path("orders", views.create_order),
    path("orders/<int:order_id>", views.show_order),
    path("orders/<int:order_id>/pay", views.pay_order),
]
