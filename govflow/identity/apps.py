from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class IdentityConfig(AppConfig):
    name = "govflow.identity"
    label = "identity"
    verbose_name = _("Identity and access")

    def ready(self) -> None:
        from recovery.api import subject_type_register

        from . import signals  # noqa: F401  (records lock-outs in the security log)
        from .rights import signals as rights_signals
        from .rights.trail import SUBJECT_TYPE

        rights_signals.connect()  # every change of rights goes on the rights trail
        subject_type_register(SUBJECT_TYPE, label="Rights changes", url=_rights_url)


def _rights_url(subject) -> str | None:
    from django.urls import NoReverseMatch, reverse

    try:
        return reverse("admin:identity_rightschange_changelist")
    except NoReverseMatch:  # a project that does not mount the admin
        return None
