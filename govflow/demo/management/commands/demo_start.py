"""Start a demo building-permit application and say where to watch it."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from govflow.demo.sample import sample_variables
from govflow.engine.provider import InvalidRequest
from govflow.engine.services.instances import instance_start, resolve_definition

from ._demo import admin_url, manage_py, user_or_error

CORRECTION = {
    "parcel": {"id": "RTD-H-3310"},
    "reason": "The parcel boundary was overwritten by a faulty bulk import.",
}


class Command(BaseCommand):
    help = (
        "Start an instance of demo.building_permit (or, with --parcel-correction, "
        "demo.parcel_correction) with realistic variables, as the demo operator, and print "
        "its id and its page in the admin."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--parcel-correction",
            action="store_true",
            help="start demo.parcel_correction (a snapshot restore) instead",
        )
        parser.add_argument("--applicant", help="the applicant's name (default: a sample one)")
        parser.add_argument("--parcel", help="the parcel id (default: the sample's)")
        parser.add_argument(
            "--as",
            dest="username",
            default="operator",
            help="the user who starts it (needs engine.start_instance)",
        )
        parser.add_argument("--tenant", default="demo-municipality")

    def handle(self, *args, parcel_correction, applicant, parcel, username, tenant, **options):
        actor = user_or_error(username)
        if parcel_correction:
            key, variables = "demo.parcel_correction", dict(CORRECTION)
            if parcel:
                variables["parcel"] = {"id": parcel}
        else:
            key = "demo.building_permit"
            variables = sample_variables(applicant=applicant, parcel=parcel)
        try:
            definition = resolve_definition(key)
        except InvalidRequest as exc:
            raise CommandError(
                f"{exc} (`manage.py load_workflows` publishes the demo "
                "workflows; `make run` does it for you.)"
            ) from None
        try:
            instance = instance_start(
                definition=definition, variables=variables, tenant=tenant, actor=actor
            )
        except InvalidRequest as exc:
            raise CommandError(str(exc)) from None
        manage = manage_py()
        applicant = variables.get("applicant", {}).get("name")
        self.stdout.write(
            f"Started instance {instance.pk} of {definition}"
            f"{f' for {applicant}' if applicant else ''} (parcel {variables['parcel']['id']}).\n"
            f"  Admin:   {admin_url(instance.pk)}\n"
            f"  Status:  {manage} demo_status {instance.pk}"
        )
        if not parcel_correction:
            self.stdout.write(
                f"  Then:    {manage} demo_inspect {instance.pk}   (after the objection period,"
                " about a minute)\n"
                f"           {manage} demo_approve {instance.pk}   (as the approver; --refuse "
                "to refuse)"
            )
