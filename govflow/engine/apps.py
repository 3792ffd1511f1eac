from django.apps import AppConfig
from django.db.models.signals import post_migrate


class EngineConfig(AppConfig):
    name = "govflow.engine"
    label = "engine"
    verbose_name = "Workflow engine"

    def ready(self) -> None:
        from recovery.api import projection_register

        from . import checks  # noqa: F401  (registers the system checks)
        from .projection import SUBJECT_TYPE, stored_projection
        from .signals import ensure_sweep_schedule

        projection_register(SUBJECT_TYPE, stored_projection)

        post_migrate.connect(ensure_sweep_schedule, sender=self)
        register_instance_subjects()


def register_instance_subjects() -> None:
    """Tell the recovery core what an instance subject is: its page, and how to approve.

    The recovery admin (which knows nothing of the engine) then links an incident to its
    instance, and approves an instance's incident through the engine's service, which
    queues the instance to continue in the same commit.
    """
    from recovery.api import subject_type_register

    from .projection import SUBJECT_TYPE
    from .services.integrity import integrity_incident_resolve_approve

    subject_type_register(
        SUBJECT_TYPE,
        label="Workflow instance",
        url=instance_admin_url,
        resolve_approve=integrity_incident_resolve_approve,
    )


def instance_admin_url(subject) -> str | None:
    from django.urls import NoReverseMatch, reverse

    from .services.integrity import instance_of_subject

    instance_id = instance_of_subject(subject)
    if instance_id is None:
        return None
    try:
        return reverse("admin:engine_instance_change", args=[instance_id])
    except NoReverseMatch:  # a project that does not mount the engine's admin
        return None
