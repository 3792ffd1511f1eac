"""Verify every checkpoint chain (or one), open incidents, exit non-zero if any is broken.

Resolving an incident takes two people, here as in the admin: ``--resolve --by A
--rationale …`` records A's request for every open incident whose chain verifies again,
and ``--approve INCIDENT --by B`` (or the incident's admin page) is B's approval.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from recovery.errors import ConflictError, RecoveryValidationError
from recovery.models import Checkpoint, IntegrityIncident, Operation
from recovery.services.incidents import subject_verify
from recovery.services.resolutions import (
    RESOLVE_PERMISSION,
    incident_resolve_approve_via_owner,
    incident_resolve_request,
)
from recovery.subjects import Subject


class Command(BaseCommand):
    help = (
        "Recompute every subject's keyed checkpoint chain and compare it with the ledger "
        "operations. Prints one line per broken chain, opens an integrity incident for it, "
        "and exits with status 1 when anything is broken. Resolving an incident takes two "
        "people: --resolve records a request, --approve (by someone else) approves it."
    )

    def add_arguments(self, parser):
        parser.add_argument("--subject", help="verify one subject only, written type:id")
        parser.add_argument(
            "--resolve",
            action="store_true",
            help="request the resolution of open incidents whose chain verifies again "
            "(needs --by and --rationale; a second person approves)",
        )
        parser.add_argument(
            "--rationale", help="with --resolve: what was repaired, and how (recorded)"
        )
        parser.add_argument(
            "--approve",
            type=int,
            metavar="INCIDENT",
            help="approve the pending resolution request of this incident (needs --by, "
            "a person other than the requester); resolves it only if its chain verifies",
        )
        parser.add_argument(
            "--by",
            metavar="USERNAME",
            help="with --resolve or --approve: who does it (needs the permission "
            f"{RESOLVE_PERMISSION})",
        )
        parser.add_argument(
            "--watermark",
            type=int,
            help="with --subject: the revision seen before (detects truncation)",
        )

    def handle(
        self,
        *args,
        subject=None,
        watermark=None,
        resolve=False,
        approve=None,
        rationale=None,
        by=None,
        verbosity=1,
        **options,
    ):
        if approve is not None:
            if resolve or subject or watermark is not None or rationale:
                raise CommandError(
                    "--approve INCIDENT approves one pending resolution request and takes "
                    "only --by; the watermark and rationale are the request's."
                )
            return self._approve(approve, self._actor(by, "--approve"))
        actor = None
        if resolve:
            actor = self._actor(by, "--resolve")
            if not (rationale or "").strip():
                raise CommandError(
                    "--resolve needs --rationale: say what was repaired and how (for example "
                    "which rows were restored from which backup). It is recorded."
                )
        elif rationale:
            raise CommandError("--rationale goes with --resolve.")
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
                    self._request(item, actor, rationale, watermark)
                if verbosity > 1:
                    self.stdout.write(f"ok {result.subject} ({result.length} checkpoints)")
        self.stdout.write(f"{len(subjects)} chain(s) verified, {broken} broken.")
        if broken:
            raise SystemExit(1)

    def _actor(self, username: str | None, option: str):
        if not username:
            raise CommandError(
                f"{option} needs --by USERNAME: resolving an incident records who requested "
                "and who approved it."
            )
        actor = get_user_model().objects.filter(username=username, is_active=True).first()
        if actor is None:
            raise CommandError(f"No active user {username!r}.")
        if not actor.has_perm(RESOLVE_PERMISSION):
            raise CommandError(
                f"{username} may not resolve integrity incidents: the permission "
                f"{RESOLVE_PERMISSION!r} is required."
            )
        return actor

    def _request(self, item: Subject, actor, rationale: str, watermark: int | None) -> None:
        for incident in IntegrityIncident.objects.filter(
            subject_type=item.type, subject_id=item.id, status="open"
        ):
            try:
                request = incident_resolve_request(
                    incident_id=incident.pk,
                    requested_by=actor,
                    rationale=rationale,
                    watermark=watermark,
                )
            except (RecoveryValidationError, ConflictError) as exc:
                self.stdout.write(f"KEPT incident {incident.pk} on {item}: {exc}")
                continue
            self.stdout.write(
                f"REQUESTED resolution {request.pk} of incident {incident.pk} on {item}: "
                "a second person with the permission "
                f"{RESOLVE_PERMISSION} approves it on the incident's admin page, or with "
                f"recovery_verify --approve {incident.pk} --by THEIR_USERNAME"
            )

    def _approve(self, incident_id: int, actor) -> None:
        try:
            outcome = incident_resolve_approve_via_owner(incident_id=incident_id, actor=actor)
        except (RecoveryValidationError, ConflictError) as exc:
            raise CommandError(str(exc)) from exc
        if outcome.resolved:
            self.stdout.write(f"RESOLVED {outcome.message}")
            return
        self.stdout.write(f"KEPT {outcome.message}")
        raise SystemExit(1)
