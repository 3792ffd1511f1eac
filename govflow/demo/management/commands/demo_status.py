"""Show where a demo instance is: status, steps, key variables and registry records."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from govflow.demo import store
from govflow.demo.models import DecisionNote
from govflow.engine import selectors

from ._demo import admin_url, instance_or_error

SHOWN = (
    "application",
    "payment",
    "notice",
    "inspection",
    "decision",
    "permit",
    "rejection",
    "restoration",
    "correction",
)


class Command(BaseCommand):
    help = "Print a demo instance's status, its steps and what the municipal registry holds."

    def add_arguments(self, parser):
        parser.add_argument("instance_id", type=int)

    def handle(self, *args, instance_id, **options):
        instance = instance_or_error(instance_id)
        out = self.stdout.write
        out(
            f"Instance {instance.pk} of {instance.definition}: {instance.status}"
            + (f" — {instance.reason}" if instance.reason else "")
        )
        out(f"  Admin: {admin_url(instance.pk)}")
        out("  Steps:")
        for token in selectors.instance_steps(instance):
            wait = f" [{token.wait_kind}]" if token.wait_kind else ""
            out(
                f"    #{token.ordinal:<3} {token.node_id:<18} {token.state}{wait}"
                + (f" — {token.reason}" if token.reason else "")
            )
        out("  Variables:")
        for name in SHOWN:
            if name in instance.variables:
                out(f"    {name}: {instance.variables[name]}")
        application_id = (instance.variables.get("application") or {}).get("id")
        if not application_id:
            self._unrecorded_registration(instance, out)
        if application_id:
            out(f"  Municipal registry ({store.store_path()}):")
            for table, rows in store.records_for(application_id).items():
                for row in rows:
                    row.pop("data", None)
                    row.pop("seq", None)
                    row["idempotency_key"] = row["idempotency_key"][:17] + "…"
                    out(f"    {table}: {row}")
        for note in DecisionNote.objects.filter(instance_id=instance.pk).order_by("pk"):
            out(f"  Case-file note: {note} — {note.text}")

    @staticmethod
    def _unrecorded_registration(instance, out) -> None:
        """What the registry holds for a registration the engine has no answer for (the
        lookup an operator makes before confirming the effect)."""
        for token in selectors.instance_steps(instance).filter(node_id="register"):
            record = token.idempotency_key and store.application_find(token.idempotency_key)
            if record:
                out(
                    f"  The municipal registry holds application {record['application_id']} "
                    f"(registered at {record['registered_at']}) under step "
                    f"#{token.ordinal}'s key."
                )
