"""Verify every checkpoint chain (or one), open incidents, exit non-zero if any is broken."""

from __future__ import annotations

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
        parser.add_argument("--resolve", action="store_true",
                            help="resolve open incidents whose chain verifies again")
        parser.add_argument("--watermark", type=int,
                            help="with --subject: the revision seen before (detects truncation)")

    def handle(self, *args, subject=None, watermark=None, resolve=False, verbosity=1,
               **options):
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
                self.stdout.write(f"BROKEN {result.subject} at #{result.position}: "
                                  f"{result.reason} (incident {incident.pk})")
            else:
                if resolve:
                    for open_incident in IntegrityIncident.objects.filter(
                        subject_type=item.type, subject_id=item.id, status="open"
                    ):
                        incident_reverify(incident=open_incident, actor=None,
                                          watermark=watermark)
                        self.stdout.write(f"RESOLVED incident {open_incident.pk} on {item}: "
                                          "the chain verifies again")
                if verbosity > 1:
                    self.stdout.write(f"ok {result.subject} ({result.length} checkpoints)")
        self.stdout.write(f"{len(subjects)} chain(s) verified, {broken} broken.")
        if broken:
            raise SystemExit(1)
