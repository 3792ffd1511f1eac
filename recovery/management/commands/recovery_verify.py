"""Verify every checkpoint chain (or one) and compare it with the anchors outside the
database, open incidents, exit non-zero if anything is broken; ``--anchor`` then appends
a full anchor.

Resolving an incident takes two people, here as in the admin: ``--resolve --by A
--rationale …`` records A's request for every open incident whose chain verifies again,
and ``--approve INCIDENT --by B`` (or the incident's admin page) is B's approval.
"""

from __future__ import annotations

import json

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from recovery.anchors import anchor_store
from recovery.errors import (
    AnchorStoreError,
    ChainKeyError,
    ConflictError,
    RecoveryValidationError,
    RevisionRollback,
)
from recovery.models import AnchorMark, Checkpoint, IntegrityIncident, Operation
from recovery.services.anchors import anchor_append
from recovery.services.incidents import (
    AnchorsReport,
    anchors_load,
    anchors_verify,
    subject_verify,
)
from recovery.services.resolution_requests import incident_resolve_request
from recovery.services.resolutions import (
    RESOLVE_PERMISSION,
    incident_resolve_approve_via_owner,
)
from recovery.subjects import Subject
from recovery.trail import TrailUnreadable, trail_verify
from recovery.watermarks import ANCHOR_STORE, LEDGER

SPECIAL = (ANCHOR_STORE, LEDGER)


def verify_file(out, path: str) -> None:
    """Verify an exported trail file offline; exit 1 (naming what broke) unless it verifies."""
    try:
        with open(path, "rb") as handle:
            document = json.loads(handle.read().decode("utf-8"))
    except OSError as exc:
        raise CommandError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise CommandError(f"{path} is not a JSON file: {exc}") from exc
    try:
        result = trail_verify(document)
    except TrailUnreadable as exc:
        raise CommandError(f"{path}: {exc}") from exc
    except ChainKeyError as exc:
        raise CommandError(
            f"{exc} Verifying a trail needs the chain key that wrote it (RECOVERY_CHAIN_KEYS)."
        ) from exc
    if result.ok:
        out.write(
            f"ok {result.subject}: {result.length} checkpoint(s) re-linked with the chain key, "
            f"{len(document['operations'])} operation(s) and {len(document['decisions'])} "
            "decision(s) agree with the replay."
        )
        return
    out.write(
        f"BROKEN {result.subject} at #{result.position}: {result.reason}. The file differs "
        "from what the chain recorded: it was edited after the export, or the chain key "
        "in the settings is not the one that wrote it."
    )
    raise SystemExit(1)


class Command(BaseCommand):
    help = (
        "With --file TRAIL.json: verify an exported audit trail offline, without the "
        "database (needs the chain key in the settings). Otherwise: recompute every "
        "subject's keyed checkpoint chain, compare it with the ledger operations and with "
        "the anchors kept outside the database. Prints one line per "
        "broken chain, opens an integrity incident for it, and exits with status 1 when "
        "anything is broken. Resolving an incident takes two "
        "people: --resolve records a request, --approve (by someone else) approves it."
    )

    def add_arguments(self, parser):
        parser.add_argument("--subject", help="verify one subject only, written type:id")
        parser.add_argument(
            "--file",
            metavar="TRAIL.json",
            help="verify an exported audit trail offline, without the database: re-links "
            "its chain with the chain key from the settings (RECOVERY_CHAIN_KEYS: the "
            "verifier needs the same key that wrote the chain) and checks its ledger "
            "operations and decision results against the replay; takes no other option",
        )
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
        parser.add_argument(
            "--anchor",
            action="store_true",
            help="after verifying, append a full anchor: every chain's head and the ledger's "
            "watermark",
        )
        parser.add_argument(
            "--no-anchors",
            action="store_true",
            help="do not compare with the anchors (truncation and rollback go unnoticed)",
        )
        parser.add_argument(
            "--restart-anchors",
            action="store_true",
            help="with --anchor: start a new anchor chain in an empty store although the "
            "database remembers an earlier one (after a deliberate restore; keep the old "
            "store as evidence)",
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
        anchor=False,
        no_anchors=False,
        restart_anchors=False,
        verbosity=1,
        **options,
    ):
        if options.get("file") is not None:
            return self._file(options["file"], subject, resolve, approve, anchor, watermark)
        if approve is not None:
            if resolve or subject or watermark is not None or rationale or anchor:
                raise CommandError(
                    "--approve INCIDENT approves one pending resolution request and takes "
                    "only --by; the watermark and rationale are the request's."
                )
            return self._approve(approve, self._actor(by, "--approve"))
        actor = self._resolver(resolve, by, rationale)
        if no_anchors and (anchor or restart_anchors):
            raise CommandError("--anchor cannot be combined with --no-anchors.")
        if restart_anchors and not anchor:
            raise CommandError("--restart-anchors needs --anchor.")
        chosen = self._subject(subject, watermark, no_anchors)
        # With --subject only that subject is verified: the anchors are read (their own
        # records verified) to compare it with them, but the ledger is not counted.
        report = None if no_anchors else self._anchors_verify(full=not subject)
        index = report.index if report is not None else None
        subjects = [chosen] if chosen is not None else self._every_subject(index)
        problems = self._report_anchors(report)
        if resolve and not subject and index is not None:
            failed = {result.subject for result, _ in report.failures}
            for item in SPECIAL:
                if item not in failed:
                    self._request(item, actor, rationale, None)
        anchors = index if index is not None else not no_anchors
        broken = 0
        for item in subjects:
            result, incident = subject_verify(subject=item, watermark=watermark, anchors=anchors)
            if not result.ok:
                broken += 1
                self._broken(result, incident)
            else:
                if resolve:
                    self._request(item, actor, rationale, watermark)
                if verbosity > 1 and item not in SPECIAL:
                    self.stdout.write(f"ok {result.subject} ({result.length} checkpoints)")
        self._summarize(report, no_anchors, len(subjects), broken, problems)
        failed = bool(broken or problems)
        if anchor:
            failed = not self._anchor(restart_anchors) or failed
        if failed:
            raise SystemExit(1)

    def _file(self, path: str, *others) -> None:
        if any(o not in (None, False) for o in others):
            raise CommandError("--file verifies one exported trail and takes no other option.")
        verify_file(self.stdout, path)

    def _summarize(
        self, report: AnchorsReport | None, no_anchors: bool, count: int, broken: int, problems: int
    ) -> None:
        self.stdout.write(self._anchors_line(report, no_anchors))
        summary = f"{count} chain(s) verified, {broken} broken"
        if problems:
            summary += f"; the anchors show {problems} problem(s) (above)"
        self.stdout.write(summary + ".")

    def _resolver(self, resolve: bool, by: str | None, rationale: str | None):
        """Who requests resolutions with ``--resolve`` (None without it); the options checked."""
        if not resolve:
            if rationale:
                raise CommandError("--rationale goes with --resolve.")
            return None
        actor = self._actor(by, "--resolve")
        if not (rationale or "").strip():
            raise CommandError(
                "--resolve needs --rationale: say what was repaired and how (for example "
                "which rows were restored from which backup). It is recorded."
            )
        return actor

    def _subject(
        self, subject: str | None, watermark: int | None, no_anchors: bool
    ) -> Subject | None:
        """The one subject ``--subject`` names (None without it); the options checked."""
        if not subject:
            if watermark is not None:
                raise CommandError("--watermark needs --subject.")
            return None
        try:
            chosen = Subject.parse(subject)
        except RecoveryValidationError as exc:
            raise CommandError(str(exc)) from exc
        if no_anchors and chosen in SPECIAL:
            raise CommandError(f"{subject} is verified against the anchors: drop --no-anchors.")
        return chosen

    def _every_subject(self, index) -> list[Subject]:
        """Every subject with checkpoints or operations, and every one the anchors name."""
        pairs = set(Checkpoint.objects.values_list("subject_type", "subject_id").distinct())
        pairs |= set(Operation.objects.values_list("subject_type", "subject_id").distinct())
        if index is not None:  # a subject removed altogether is still anchored
            pairs |= {(s.type, s.id) for s in index.subjects()}
        return [Subject(t, i) for t, i in sorted(pairs)]

    def _broken(self, result, incident) -> None:
        at = f" at #{result.position}" if result.position is not None else ""
        self.stdout.write(f"BROKEN {result.subject}{at}: {result.reason} (incident {incident.pk})")

    def _anchors_verify(self, *, full: bool) -> AnchorsReport:
        try:
            return anchors_verify() if full else AnchorsReport(anchors_load())
        except AnchorStoreError as exc:
            raise CommandError(
                f"{exc} To verify without the anchors, pass --no-anchors (truncation and "
                "rollback then go unnoticed)."
            ) from exc

    def _report_anchors(self, report: AnchorsReport | None) -> int:
        """Print the anchors' own failures; return how many there were."""
        if report is None:
            return 0
        for result, incident in report.failures:
            self._broken(result, incident)
        return len(report.failures)

    def _anchors_line(self, report: AnchorsReport | None, no_anchors: bool) -> str:
        if no_anchors:
            return "Anchors: not compared (--no-anchors)."
        if report is None or report.index is None:
            return (
                "Anchors: turned off (RECOVERY_ANCHOR_STORE is empty); truncation and "
                "rollback go unnoticed."
            )
        index = report.index
        if index.latest is None:
            return (
                f"Anchors: none yet in {index.store}, nothing to compare with (the sweeper "
                "appends them; --anchor appends a full one now)."
            )
        return (
            f"Anchors: compared with {index.records} record(s) in {index.store} "
            f"(newest #{index.latest.n} at {index.latest.at})."
        )

    def _anchor(self, restart: bool) -> bool:
        try:
            if restart:
                self._restart()
            result = anchor_append(full=True)
        except (AnchorStoreError, RevisionRollback, ChainKeyError) as exc:
            self.stdout.write(f"NOT ANCHORED: {exc}")
            return False
        if not result.records:
            self.stdout.write(f"ANCHORED nothing: {result.store} holds no chain yet.")
            return True
        first, last = result.records[0], result.records[-1]
        heads = sum(len(record.heads) for record in result.records if record.mode == "full")
        self.stdout.write(
            f"ANCHORED the heads of {heads} chain(s) in record(s) #{first.n}-#{last.n} of "
            f"{result.store} (ledger: checkpoint {last.ledger.checkpoint}, "
            f"{last.ledger.count} checkpoint(s))."
        )
        return True

    def _restart(self) -> None:
        store = anchor_store()
        if store is None:
            return
        if any(True for _ in store.lines()):
            raise AnchorStoreError(
                f"--restart-anchors starts a new anchor chain in an empty store, but {store} "
                "holds records. Move it aside (keep it: it is the evidence of what the "
                "database held), then run this again."
            )
        AnchorMark.objects.filter(store=str(store)).delete()
        self.stdout.write(f"RESTARTED the anchors in {store}: the database forgot the old ones.")

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
