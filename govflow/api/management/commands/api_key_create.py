"""Create an API key from the command line (the admin does the same), and show it once."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from govflow.api.models import ApiKey
from govflow.api.scopes import SCOPES, scope_problem


class Command(BaseCommand):
    help = (
        "Create an API key for a tenant with the given scopes and print it: it is shown "
        "this once (only a hash is stored). With --file, the key is written to that file "
        "(mode 0600) instead, and a usable key of the same name and tenant already in the "
        "file is kept rather than replaced (for scripted set-ups such as make run)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True, help="What the key is for (50 chars).")
        parser.add_argument("--tenant", required=True)
        parser.add_argument(
            "--scope",
            action="append",
            dest="scopes",
            default=[],
            help=f"Repeat for each scope: {', '.join(SCOPES)}, tasks:<topic>; or 'all' (every "
            "scope but the task scopes, which are named besides it).",
        )
        parser.add_argument("--expires-in-days", type=float, default=None)
        parser.add_argument("--file", default=None)

    def handle(self, *args, name, tenant, scopes, expires_in_days, file, **options):
        # 'all' is every fixed scope; task scopes (tasks:<topic>) are named besides it.
        if "all" in scopes:
            scopes = [*SCOPES, *(s for s in scopes if s != "all")]
        scopes = sorted(set(scopes))
        problems = [p for p in map(scope_problem, scopes) if p]
        if problems:
            raise CommandError(" ".join(problems))
        if not tenant.strip() or len(tenant) > 100:
            raise CommandError("--tenant is 1 to 100 characters.")
        if not name.strip() or len(name) > 50:
            raise CommandError("--name is 1 to 50 characters.")
        target = Path(file) if file else None
        if target is not None and self._kept(target, name, tenant, scopes):
            self.stdout.write(f"API key {name!r} for tenant {tenant!r} kept ({target}).")
            return
        expiry = timezone.now() + dt.timedelta(days=expires_in_days) if expires_in_days else None
        api_key, key = ApiKey.objects.create_key(
            name=name, tenant=tenant, scopes=scopes, expiry_date=expiry
        )
        if target is None:
            self.stdout.write(
                f"API key {name!r} for tenant {tenant!r} ({api_key.prefix}), scopes "
                f"{', '.join(scopes) or 'none'}. It is shown this once:\n{key}"
            )
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(key + "\n")
        self.stdout.write(f"API key {name!r} for tenant {tenant!r} written to {target}.")

    @staticmethod
    def _kept(target: Path, name: str, tenant: str, scopes: list[str]) -> bool:
        try:
            key = target.read_text().strip()
        except OSError:
            return False
        found = ApiKey.objects.filter(prefix=key.partition(".")[0]).first()
        return bool(
            found is not None
            and found.is_valid(key)
            and not found.revoked
            and not found.has_expired
            and (found.name, found.tenant, sorted(found.scopes or [])) == (name, tenant, scopes)
        )
