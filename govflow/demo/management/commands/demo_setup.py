"""Create (or refresh) the demo logins, publish the demo workflows, and a demo API key."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from govflow.engine.tenancy import tenant_group_name
from govflow.handoffs.roles import roles_install

DEMO_TENANT = "demo-municipality"  # demo_start's default tenant
DEMO_KEY_NAME = "demo integration"
# The desk's roles (groups made by the handoffs migration, ADR 0018) and the demo tenant's
# group; the demo's own permissions go to the users themselves (they are not a role's).
DEMO_OPERATE = [("govflow_demo", "view_decisionnote")]
DEMO_APPROVE = [*DEMO_OPERATE, ("govflow_demo", "approve_permit")]
# Two approvers, so that every four-eyes path can be tried with the demo logins: one
# requests (a decision, an incident's resolution), the other approves. An approver is an
# operator too (the one who requests).
LOGINS = (
    ("operator", ("Operator",), DEMO_OPERATE),
    ("approver", ("Operator", "Approver"), DEMO_APPROVE),
    ("approver2", ("Operator", "Approver"), DEMO_APPROVE),
    ("auditor", ("Auditor",), DEMO_OPERATE),
)


class Command(BaseCommand):
    help = (
        "Create the demo logins 'operator', 'approver', 'approver2' and 'auditor' with the "
        "given password, in the demo tenant, and publish the demo workflows "
        "(load_workflows). With --api-key-file, also an API key "
        "for the demo tenant with every scope (and the demo's task topic), written to that "
        "file (kept while usable). "
        "Development only."
    )

    def add_arguments(self, parser):
        parser.add_argument("--password", required=True)
        parser.add_argument("--api-key-file", default=None)

    def handle(self, *args, password: str, api_key_file: str | None, **options):
        self._logins(password)
        self.stdout.write(f"Demo logins ready: {', '.join(name for name, _, _ in LOGINS)}.")
        call_command("load_workflows", stdout=self.stdout, stderr=self.stderr)
        if api_key_file:
            call_command(
                "api_key_create",
                name=DEMO_KEY_NAME,
                tenant=DEMO_TENANT,
                scopes=["all", "tasks:demo.address_check"],
                file=api_key_file,
                stdout=self.stdout,
                stderr=self.stderr,
            )

    @transaction.atomic
    def _logins(self, password: str) -> None:
        users = get_user_model()
        roles_install(Group, Permission)  # as the migration did (a flushed database lost them)
        tenant, _ = Group.objects.get_or_create(name=tenant_group_name(DEMO_TENANT))
        for username, roles, perms in LOGINS:
            user, _ = users.objects.get_or_create(username=username)
            user.is_staff = True
            user.set_password(password)
            user.save()
            user.groups.set([_role(name) for name in roles] + [tenant])
            user.user_permissions.set(_permission(app, code) for app, code in perms)


def _role(name: str) -> Group:
    try:
        return Group.objects.get(name=name)
    except Group.DoesNotExist:
        raise CommandError(
            f"The role {name!r} does not exist. Run `manage.py migrate` first (it creates "
            "the roles)."
        ) from None


def _permission(app_label: str, codename: str) -> Permission:
    try:
        return Permission.objects.get(content_type__app_label=app_label, codename=codename)
    except Permission.DoesNotExist:
        raise CommandError(
            f"Permission {app_label}.{codename} does not exist. Run "
            "`manage.py migrate` first (it creates permissions)."
        ) from None
