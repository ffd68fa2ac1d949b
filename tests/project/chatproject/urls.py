from chat import views
from django.urls import path, re_path

urlpatterns = [
    path("", views.index, name="index"),
    re_path(r"^room/(?P<room>[A-Za-z0-9_.-]{1,50})/$", views.index, name="room"),
    path("hello/", views.hello, name="hello"),
    path("ping/", views.ping, name="ping"),
]
