"""Decide the approval a demo building permit waits for, as the demo approver."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from govflow.engine import selectors
from govflow.engine.provider import EngineConflict, IntegrityStop, InvalidRequest
from govflow.handoffs.services.desk import approval_decide

from ._demo import instance_or_error, user_or_error


class Command(BaseCommand):
    help = (
        "Approve (or --refuse) the permit decision a demo.building_permit instance waits "
        "for. The user needs govflow_demo.approve_permit."
    )

    def add_arguments(self, parser):
        parser.add_argument("instance_id", type=int)
        parser.add_argument("--refuse", action="store_true", help="refuse the permit")
        parser.add_argument("--note", default="")
        parser.add_argument("--as", dest="username", default="approver")

    def handle(self, *args, instance_id, refuse, note, username, **options):
        instance = instance_or_error(instance_id)
        actor = user_or_error(username)
        token = selectors.step_waiting(
            instance_id=instance.pk, wait_kind=selectors.WaitKind.APPROVAL
        )
        if token is None:
            raise CommandError(
                f"Instance {instance_id} is not waiting for an approval (it is "
                f"{instance.status}). `manage.py demo_status {instance_id}` "
                "shows where it is."
            )
        note = note or (
            "Refused: the extension exceeds the permitted floor area."
            if refuse
            else "Approved: complies with the zoning plan."
        )
        try:
            approval_decide(
                instance_id=instance_id,
                token_id=token.pk,
                actor=actor,
                approved=not refuse,
                note=note,
            )
        except (EngineConflict, IntegrityStop, InvalidRequest) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"{'Refused' if refuse else 'Approved'} by {actor.get_username()}: "
            f"instance {instance_id} moves on."
        )
