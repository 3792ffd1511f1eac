"""Deliver the site-inspection report a demo building permit waits for."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from govflow.engine.provider import EngineConflict, IntegrityStop, InvalidRequest
from govflow.engine.services.triggers import trigger_deliver

from ._demo import application_id_or_error, instance_or_error

MESSAGE = "inspection.completed"


class Command(BaseCommand):
    help = (
        "Deliver the 'inspection.completed' message for a demo.building_permit instance, "
        "correlated by its application number. Delivering it twice is harmless."
    )

    def add_arguments(self, parser):
        parser.add_argument("instance_id", type=int)
        parser.add_argument("--result", choices=["passed", "failed"], default="passed")
        parser.add_argument("--inspector", default="J. de Vries (building inspector)")
        parser.add_argument("--remarks", default="Foundations and setbacks as drawn.")

    def handle(self, *args, instance_id, result, inspector, remarks, **options):
        instance = instance_or_error(instance_id)
        application_id = application_id_or_error(instance)
        try:
            delivery = trigger_deliver(
                message=MESSAGE,
                correlation=application_id,
                delivery_id=f"inspection:{application_id}",
                payload={"result": result, "inspector": inspector, "remarks": remarks},
            )
        except (EngineConflict, IntegrityStop, InvalidRequest) as exc:
            raise CommandError(str(exc)) from None
        if delivery.state == "consumed":
            self.stdout.write(
                f"Inspection report for {application_id} ({result}) delivered to "
                f"instance {instance_id}; it moves on to the approval."
            )
        else:
            self.stdout.write(
                f"Inspection report for {application_id} ({result}) received and "
                "kept: the instance is not waiting for it yet (objection period?) "
                "and takes it as soon as it is."
            )
