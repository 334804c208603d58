from django.contrib import admin
from django.contrib.auth.decorators import login_required
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from chat import mcp_admin

from . import health, outage_middleware

# What escapes a middleware: a database outage is a 503, anything else a 500.
handler500 = outage_middleware.handler500


class SwaggerView(SpectacularSwaggerSplitView):
    """Swagger UI from the sidecar package; its start-up script a separate file,
    so the page keeps the site's Content-Security-Policy (no inline script)."""

    template_name = "api/swagger_ui.html"


urlpatterns = [
    # Before the admin's own URLs, which would answer this path 404.
    path(
        "admin/mcp-servers/",
        admin.site.admin_view(mcp_admin.mcp_servers_view),
        name="admin-mcp-servers",
    ),
    path("admin/", admin.site.urls),
    path("healthz", health.healthz, name="healthz"),
    path("metrics", health.metrics_view, name="metrics"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path(
        "api/docs/",
        login_required(SwaggerView.as_view(url_name="api-schema")),
        name="api-docs",
    ),
    path("", include("chat.urls")),
    path("", include("chat.page_urls")),
]
