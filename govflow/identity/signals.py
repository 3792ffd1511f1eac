"""Lock-outs go to the ``govflow.security`` log as well as to axes' access tables."""

from __future__ import annotations

import logging

from axes.signals import user_locked_out
from django.dispatch import receiver

log = logging.getLogger("govflow.security")


@receiver(user_locked_out)
def record_lockout(sender, request, username=None, ip_address=None, **kwargs) -> None:
    log.warning("login locked out: username=%r address=%s", username, ip_address)
