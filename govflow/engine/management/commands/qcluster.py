"""``manage.py qcluster``: django-q2's cluster, with the GovFlow sweeper in its main process.

It overrides django-q2's command of the same name (``govflow.engine`` comes before
``django_q`` in ``INSTALLED_APPS``) and keeps its options; see ``govflow/engine/cluster.py``
and ADR 0005.

Before it starts, it runs every system check but the web's (``checks.qcluster_check_tags``,
ADR 0048): a misconfigured engine, outbox, chain key or database model still stops it,
but the URLconf, the admin and the templates, which a cluster never serves, are neither
checked nor loaded here (``manage.py check`` in the deployment checks them).
"""

from __future__ import annotations

import os

from django.conf import settings
from django_q.management.commands.qcluster import Command as DjangoQClusterCommand

from ...checks import qcluster_check_tags
from ...cluster import cluster_run


class Command(DjangoQClusterCommand):
    help = (
        "Starts a Django Q cluster. Its main process also runs the GovFlow sweeper (due "
        "timers, orphaned work), or stands by while another cluster's sweeper is alive."
    )

    def check(self, app_configs=None, tags=None, **kwargs):
        """Django's check before ``handle`` (``requires_system_checks``), without the
        checks of what a cluster never serves (``NOT_FOR_WORKERS``)."""
        if tags is None:
            tags = qcluster_check_tags()
        return super().check(app_configs, tags, **kwargs)

    def handle(self, *args, **options):
        # As django-q2's command: signing needs the SECRET_KEY, and the cluster name (the
        # ORM broker's queue key) must be set before the cluster is created.
        settings.SECRET_KEY  # noqa: B018
        cluster_name = options.get("cluster_name")
        if cluster_name:
            os.environ["Q_CLUSTER_NAME"] = cluster_name
        cluster_run(run_once=options.get("run_once", False))
