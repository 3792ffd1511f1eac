"""``/api/``: version 1 of the REST API, its schema and viewers, and 404s for the rest."""

from django.urls import path, re_path, register_converter
from drf_spectacular.views import SpectacularRedocView, SpectacularSwaggerView

from .views import (
    audit,
    compensations,
    definitions,
    handoffs,
    instances,
    meta,
    tasks,
    triggers,
    webhooks,
)


class IdConverter:
    """A positive id of at most 18 digits (anything longer is no row: a 404)."""

    regex = "[0-9]{1,18}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value) -> str:
        return str(value)


register_converter(IdConverter, "id")

KEY = r"(?P<key>[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)+)"

app_name = "api"
urlpatterns = [
    path("v1/schema/", meta.SchemaView.as_view(), name="schema"),
    path("v1/docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="docs"),
    path("v1/redoc/", SpectacularRedocView.as_view(url_name="api:schema"), name="redoc"),
    path("v1/problems/", meta.ProblemTypeList.as_view(), name="problem-list"),
    re_path(
        r"^v1/problems/(?P<code>[a-z-]{1,40})/$",
        meta.ProblemTypeDetail.as_view(),
        name="problem-detail",
    ),
    path("v1/me/", meta.MeView.as_view(), name="me"),
    path("v1/definitions/", definitions.DefinitionList.as_view(), name="definition-list"),
    path(
        "v1/definitions/validate/",
        definitions.DefinitionValidate.as_view(),
        name="definition-validate",
    ),
    re_path(
        rf"^v1/definitions/{KEY}/$",
        definitions.DefinitionDetail.as_view(),
        name="definition-detail",
    ),
    re_path(
        rf"^v1/definitions/{KEY}/(?P<version>[0-9]{{1,10}})/$",
        definitions.DefinitionVersion.as_view(),
        name="definition-version",
    ),
    path("v1/instances/", instances.InstanceList.as_view(), name="instance-list"),
    path("v1/instances/<id:pk>/", instances.InstanceDetail.as_view(), name="instance-detail"),
    path(
        "v1/instances/<id:pk>/cancel/",
        instances.InstanceCancel.as_view(),
        name="instance-cancel",
    ),
    path("v1/instances/<id:pk>/ledger/", audit.InstanceLedger.as_view(), name="instance-ledger"),
    path("v1/instances/<id:pk>/chain/", audit.InstanceChain.as_view(), name="instance-chain"),
    path(
        "v1/instances/<id:pk>/chain/verify/",
        audit.InstanceChainVerify.as_view(),
        name="instance-chain-verify",
    ),
    path("v1/instances/<id:pk>/audit/", audit.InstanceAudit.as_view(), name="instance-audit"),
    path(
        "v1/instances/<id:pk>/compensations/",
        compensations.InstanceCompensations.as_view(),
        name="instance-compensations",
    ),
    path(
        "v1/triggers/deliveries/",
        triggers.TriggerDeliveries.as_view(),
        name="trigger-delivery-list",
    ),
    re_path(
        r"^v1/triggers/deliveries/(?P<delivery_id>[A-Za-z0-9._~-]{1,99})/$",
        triggers.TriggerDeliveryDetail.as_view(),
        name="trigger-delivery-detail",
    ),
    path("v1/handoffs/", handoffs.HandoffList.as_view(), name="handoff-list"),
    path("v1/handoffs/<id:pk>/", handoffs.HandoffDetail.as_view(), name="handoff-detail"),
    path("v1/tasks/fetch-and-lock/", tasks.FetchAndLock.as_view(), name="task-fetch-and-lock"),
    path("v1/tasks/<id:pk>/", tasks.TaskDetail.as_view(), name="task-detail"),
    path("v1/tasks/<id:pk>/extend-lock/", tasks.ExtendLock.as_view(), name="task-extend-lock"),
    path("v1/tasks/<id:pk>/complete/", tasks.Complete.as_view(), name="task-complete"),
    path("v1/tasks/<id:pk>/fail/", tasks.Fail.as_view(), name="task-fail"),
    path("v1/tasks/<id:pk>/bpmn-error/", tasks.BpmnError.as_view(), name="task-bpmn-error"),
    path("v1/webhooks/", webhooks.WebhookList.as_view(), name="webhook-list"),
    path("v1/webhooks/<id:pk>/", webhooks.WebhookDetail.as_view(), name="webhook-detail"),
    path(
        "v1/webhooks/<id:pk>/activate/",
        webhooks.WebhookActivate.as_view(),
        name="webhook-activate",
    ),
    path(
        "v1/webhooks/<id:pk>/deactivate/",
        webhooks.WebhookDeactivate.as_view(),
        name="webhook-deactivate",
    ),
    path(
        "v1/webhooks/<id:pk>/rotate-secret/",
        webhooks.WebhookRotateSecret.as_view(),
        name="webhook-rotate-secret",
    ),
    re_path(r"^(?P<rest>[\s\S]*)$", meta.not_found, name="not-found"),
]
