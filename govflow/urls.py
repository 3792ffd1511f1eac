"""Root URL configuration."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
    path("api/", include("govflow.api.urls")),
    # The desk's language switch posts to Django's set_language here.
    path("i18n/", include("django.conf.urls.i18n")),
]

# Problems (application/problem+json) under /api/, Django's pages elsewhere.
handler400 = "govflow.api.problems.handler400"
handler403 = "govflow.api.problems.handler403"
handler404 = "govflow.api.problems.handler404"
handler500 = "govflow.api.problems.handler500"
