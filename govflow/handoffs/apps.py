from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class HandoffsConfig(AppConfig):
    """The operator's side of the engine: instance pages, handoffs, decisions, approvals.

    It sits on top of the engine (``govflow.engine`` never imports it) and registers the
    engine's instance subjects with the recovery core, because resolving an instance's
    integrity incident is an operator's act that re-queues the instance.
    """

    name = "govflow.handoffs"
    label = "handoffs"
    verbose_name = _("Handoffs and decisions")

    def ready(self) -> None:
        register_instance_subjects()


def register_instance_subjects() -> None:
    """Tell the recovery core what an instance subject is: its page, and how to approve.

    The recovery admin (which knows nothing of the engine) then links an incident to its
    instance, and approves an instance's incident through the handoffs app's service, which
    queues the instance to continue in the same commit.
    """
    from govflow.engine.projection import SUBJECT_TYPE
    from govflow.engine.tenancy import instance_ids_of
    from recovery.api import subject_type_register

    from .services.integrity import integrity_incident_resolve_approve

    subject_type_register(
        SUBJECT_TYPE,
        label="Workflow instance",
        url=instance_admin_url,
        resolve_approve=integrity_incident_resolve_approve,
        visible=instance_ids_of,  # a desk user sees the ledger of its tenants' instances
    )


def instance_admin_url(subject) -> str | None:
    from django.urls import NoReverseMatch, reverse

    from .services.integrity import instance_of_subject

    instance_id = instance_of_subject(subject)
    if instance_id is None:
        return None
    try:
        return reverse("admin:engine_instance_change", args=[instance_id])
    except NoReverseMatch:  # a project that does not mount the admin
        return None
