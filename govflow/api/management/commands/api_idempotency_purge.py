"""Delete stored Idempotency-Key answers older than the idempotency window."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from govflow.api.idempotency import purge_expired, ttl


class Command(BaseCommand):
    help = (
        "Delete the stored answers of requests made with an Idempotency-Key once they are "
        "older than GOVFLOW_API_IDEMPOTENCY_TTL (default 24 hours). Safe to run at any "
        "time, e.g. hourly from cron; a request finding an expired record replaces it anyway."
    )

    def handle(self, *args, **options):
        deleted = purge_expired()
        hours = ttl().total_seconds() / 3600
        self.stdout.write(f"Deleted {deleted} idempotency record(s) older than {hours:g} hours.")
