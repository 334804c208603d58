"""Routes of `journal.tests.settings_standalone`: the admin, nothing of chat."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
