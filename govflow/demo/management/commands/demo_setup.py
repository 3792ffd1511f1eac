"""Create (or refresh) the demo operator and approver logins."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management.base import BaseCommand
from django.db import transaction

OPERATOR_PERMS = [
    ("recovery", "view_operation"), ("recovery", "view_checkpoint"), ("recovery", "view_lease"),
    ("recovery", "view_integrityincident"), ("recovery", "view_decision"),
    ("recovery", "request_decision"),
]
APPROVER_PERMS = [*OPERATOR_PERMS, ("recovery", "approve_decision")]


class Command(BaseCommand):
    help = "Create the demo 'operator' and 'approver' logins with the given password."

    def add_arguments(self, parser):
        parser.add_argument("--password", required=True)

    @transaction.atomic
    def handle(self, *args, password: str, **options):
        users = get_user_model()
        for username, group_name, perms in (
            ("operator", "Operators", OPERATOR_PERMS),
            ("approver", "Approvers", APPROVER_PERMS),
        ):
            group, _ = Group.objects.get_or_create(name=group_name)
            group.permissions.set(
                Permission.objects.get(content_type__app_label=app, codename=code)
                for app, code in perms
            )
            user, _ = users.objects.get_or_create(username=username)
            user.is_staff = True
            user.set_password(password)
            user.save()
            user.groups.set([group])
        self.stdout.write("Demo logins ready: operator, approver.")
