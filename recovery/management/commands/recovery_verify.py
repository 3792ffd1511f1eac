"""Verify every checkpoint chain (or one), open incidents, exit non-zero if any is broken."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from recovery.errors import RecoveryValidationError
from recovery.models import Checkpoint, IntegrityIncident, Operation
from recovery.services.incidents import incident_reverify, subject_verify
from recovery.subjects import Subject


class Command(BaseCommand):
    help = (
        "Recompute every subject's keyed checkpoint chain and compare it with the ledger "
        "operations. Prints one line per broken chain, opens an integrity incident for it, "
        "and exits with status 1 when anything is broken."
    )

    def add_arguments(self, parser):
        parser.add_argument("--subject", help="verify one subject only, written type:id")
        parser.add_argument(
            "--resolve",
            action="store_true",
            help="resolve open incidents whose chain verifies again (needs --by)",
        )
        parser.add_argument(
            "--by", metavar="USERNAME", help="with --resolve: the operator who repaired the cause"
        )
        parser.add_argument(
            "--watermark",
            type=int,
            help="with --subject: the revision seen before (detects truncation)",
        )

    def handle(
        self, *args, subject=None, watermark=None, resolve=False, by=None, verbosity=1, **options
    ):
        actor = None
        if resolve:
            if not by:
                raise CommandError(
                    "--resolve needs --by USERNAME: resolving an incident "
                    "records who repaired its cause."
                )
            actor = get_user_model().objects.filter(username=by, is_active=True).first()
            if actor is None:
                raise CommandError(f"No active user {by!r}.")
        if subject:
            try:
                subjects = [Subject.parse(subject)]
            except RecoveryValidationError as exc:
                raise CommandError(str(exc)) from exc
        else:
            if watermark is not None:
                raise CommandError("--watermark needs --subject.")
            pairs = set(Checkpoint.objects.values_list("subject_type", "subject_id").distinct())
            pairs |= set(Operation.objects.values_list("subject_type", "subject_id").distinct())
            subjects = [Subject(t, i) for t, i in sorted(pairs)]
        broken = 0
        for item in subjects:
            result, incident = subject_verify(subject=item, watermark=watermark)
            if not result.ok:
                broken += 1
                self.stdout.write(
                    f"BROKEN {result.subject} at #{result.position}: "
                    f"{result.reason} (incident {incident.pk})"
                )
            else:
                if resolve:
                    self._resolve(item, result, actor, watermark)
                if verbosity > 1:
                    self.stdout.write(f"ok {result.subject} ({result.length} checkpoints)")
        self.stdout.write(f"{len(subjects)} chain(s) verified, {broken} broken.")
        if broken:
            raise SystemExit(1)

    def _resolve(self, item, result, actor, watermark) -> None:
        for incident in IntegrityIncident.objects.filter(
            subject_type=item.type, subject_id=item.id, status="open"
        ):
            if result.length == 0 and watermark is None:
                # Deleting everything leaves an empty chain that "verifies": never enough.
                self.stdout.write(
                    f"KEPT incident {incident.pk} on {item}: its chain is empty; "
                    "give --watermark with the revision last seen to resolve it"
                )
                continue
            check = incident_reverify(incident=incident, actor=actor, watermark=watermark)
            if check.ok:
                self.stdout.write(
                    f"RESOLVED incident {incident.pk} on {item}: the chain verifies again"
                )
            else:
                self.stdout.write(f"KEPT incident {incident.pk} on {item}: {check.reason}")
