"""``manage.py dataflow``: the demo module's own hands (fault switch, publish, reconcile)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from ... import services
from ...models import DataflowRun, FaultMode


class Command(BaseCommand):
    help = (
        "Dataflow demo module: list its runs, set the fault switch, publish a held run or "
        "reconcile an unknown publication."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--fault", choices=[m or "none" for m in FaultMode.values])
        parser.add_argument("--publish", metavar="DF-N", help="publish a held run")
        parser.add_argument("--reconcile", metavar="DF-N|all", help="settle unknown ones")

    def handle(self, *args, **options) -> None:
        if options["fault"]:
            mode = "" if options["fault"] == "none" else options["fault"]
            services.fault_set(mode)
            self.stdout.write(f"Fault switch: {mode or 'none'}")
        if options["publish"]:
            run = services.run_publish(run_id=self._run(options["publish"]).pk)
            self.stdout.write(f"{run.reference}: {run.state}")
        if options["reconcile"]:
            runs = (
                DataflowRun.objects.filter(state="unknown_publication")
                if options["reconcile"] == "all"
                else [self._run(options["reconcile"])]
            )
            for run in runs:
                run = services.run_reconcile(run_id=run.pk)
                self.stdout.write(f"{run.reference}: {run.state} {run.reason_code}".rstrip())
        for run in DataflowRun.objects.order_by("pk"):
            self.stdout.write(f"{run} {run.reason_code}".rstrip())

    def _run(self, ref: str) -> DataflowRun:
        try:
            return DataflowRun.objects.get(pk=int(ref.removeprefix("DF-")))
        except (ValueError, DataflowRun.DoesNotExist):
            raise CommandError(
                f"No Dataflow run {ref!r}; list them with manage.py dataflow."
            ) from None
