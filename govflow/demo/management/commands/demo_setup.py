"""Create (or refresh) the demo logins, publish the demo workflows, and a demo API key."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

DEMO_TENANT = "demo-municipality"  # demo_start's default tenant
DEMO_KEY_NAME = "demo integration"
ENGINE_VIEW = ["definition", "instance", "token", "timer", "triggerdelivery", "incident"]
OPERATOR_PERMS = [
    ("recovery", "view_operation"),
    ("recovery", "view_checkpoint"),
    ("recovery", "view_lease"),
    ("recovery", "view_integrityincident"),
    ("recovery", "view_decision"),
    ("recovery", "request_decision"),
    *(("engine", f"view_{model}") for model in ENGINE_VIEW),
    ("engine", "start_instance"),
    ("engine", "operate_instance"),
    ("govflow_demo", "view_decisionnote"),
]
APPROVER_PERMS = [
    *OPERATOR_PERMS,
    ("recovery", "approve_decision"),
    ("recovery", "resolve_incident"),
    ("govflow_demo", "approve_permit"),
]
# Two approvers, so that every four-eyes path can be tried with the demo logins: one
# requests (a decision, an incident's resolution), the other approves.
LOGINS = (
    ("operator", "Operators", OPERATOR_PERMS),
    ("approver", "Approvers", APPROVER_PERMS),
    ("approver2", "Approvers", APPROVER_PERMS),
)


class Command(BaseCommand):
    help = (
        "Create the demo logins 'operator', 'approver' and 'approver2' with the given password and "
        "publish the demo workflows (load_workflows). With --api-key-file, also an API key "
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
        for username, group_name, perms in LOGINS:
            group, _ = Group.objects.get_or_create(name=group_name)
            group.permissions.set(_permission(app, code) for app, code in perms)
            user, _ = users.objects.get_or_create(username=username)
            user.is_staff = True
            user.set_password(password)
            user.save()
            user.groups.set([group])


def _permission(app_label: str, codename: str) -> Permission:
    try:
        return Permission.objects.get(content_type__app_label=app_label, codename=codename)
    except Permission.DoesNotExist:
        raise CommandError(
            f"Permission {app_label}.{codename} does not exist. Run "
            "`manage.py migrate` first (it creates permissions)."
        ) from None
