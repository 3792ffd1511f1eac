"""A rights change that waits for a second administrator (four-eyes on rights, ADR 0025).

Only grants wait: a change that gives someone an approving role, a desk permission, a
tenant, superuser or staff. Removals apply at once. Every change, waiting or not, is a
fact on the rights trail (:mod:`govflow.identity.rights.trail`); this row is the fast,
queryable projection of a grant's request and its decision.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils.translation import gettext_lazy as _


class RightsChangeKind(models.TextChoices):
    GROUP_ADD = "group_add", _("Add to group")
    PERMISSION_GRANT = "permission_grant", _("Grant permission")
    FLAG_SET = "flag_set", _("Set flag")


class RightsChangeState(models.TextChoices):
    PENDING = "pending", _("Awaiting confirmation")
    CONFIRMED = "confirmed", _("Confirmed and applied")
    REJECTED = "rejected", _("Rejected")


class RightsChange(models.Model):
    """One grant requested by an administrator, confirmed or rejected by another."""

    kind = models.CharField(_("kind"), max_length=20, choices=RightsChangeKind.choices)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        verbose_name=_("user"),
        help_text=_("The user who would receive the right (empty for a group's permission)."),
    )
    group = models.ForeignKey(
        "auth.Group",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        verbose_name=_("group"),
        help_text=_("The group the user joins, or the group that receives the permission."),
    )
    permission = models.ForeignKey(
        "auth.Permission",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        verbose_name=_("permission"),
    )
    flag = models.CharField(_("flag"), max_length=20, blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="+",
        verbose_name=_("requested by"),
    )
    requested_at = models.DateTimeField(_("requested at"), auto_now_add=True)
    state = models.CharField(
        _("state"),
        max_length=12,
        choices=RightsChangeState.choices,
        default=RightsChangeState.PENDING,
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        verbose_name=_("decided by"),
    )
    decided_at = models.DateTimeField(_("decided at"), null=True, blank=True)
    note = models.TextField(_("note"), blank=True)

    class Meta:
        verbose_name = _("rights change")
        verbose_name_plural = _("rights changes")
        ordering = ["-requested_at", "-pk"]
        constraints = [
            # No one grants rights to themselves, and no one confirms their own request
            # or a grant to themselves: checked by the services, and here once more.
            models.CheckConstraint(
                condition=Q(user__isnull=True) | ~Q(user=F("requested_by")),
                name="identity_rights_no_self_grant",
            ),
            models.CheckConstraint(
                condition=~Q(state="confirmed")
                | (
                    ~Q(decided_by=F("requested_by"))
                    & (Q(user__isnull=True) | ~Q(decided_by=F("user")))
                ),
                name="identity_rights_four_eyes",
            ),
        ]
        indexes = [models.Index(fields=["state", "requested_at"], name="identity_rights_state")]

    def __str__(self) -> str:
        return f"#{self.pk} {self.get_kind_display()}: {self.describe()}"

    def describe(self) -> str:
        """What the change gives, in words ("ada joins Approver")."""
        from .rights.words import change_words

        return change_words(self)
