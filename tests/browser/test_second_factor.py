"""An approver without a second factor is refused, enrols an authenticator app, logs in
with its code and approves: issue 14 on screen, in Chromium."""

from __future__ import annotations

import base64

import pytest
from django.test import Client
from django_otp.oath import TOTP
from django_otp.plugins.otp_totp.models import TOTPDevice
from selenium.webdriver.common.by import By

from recovery.models import Decision
from tests.identity import verified_login
from tests.integration.test_engine_admin import decision_form

from .test_operator_admin import blocked_instance

pytestmark = pytest.mark.django_db(transaction=True)


def code_from(secret: str, after: int | None = None) -> str:
    """What an authenticator app shows for ``secret`` (RFC 6238: 30 s steps, six digits).

    With ``after``, the code of the first 30 s window later than window ``after``: now's
    code once the clock has moved on, else the app's next one. (The window a code was
    accepted in is the device's ``last_t``; when a window boundary passed between typing a
    code and the server checking it, django-otp records that as drift, and "now + 1"
    could then fall outside its tolerance.)
    """
    totp = TOTP(base64.b32decode(secret), step=30, digits=6)
    if after is not None and totp.t() <= after:
        totp.time = totp.time + 30 * (after + 1 - totp.t())
    return f"{totp.token():06d}"


def test_an_approver_enrols_an_app_logs_in_with_its_code_and_approves(
    browser, operator, checker, tmp_path
):
    instance = blocked_instance()
    token = instance.tokens.get(node_id="write")
    page = f"/admin/engine/instance/{instance.pk}/change/"
    verified_login(Client(), operator).post(
        f"/admin/engine/instance/{instance.pk}/steps/{token.pk}/handoff/", decision_form(token)
    )
    decision = Decision.objects.get()

    carl = browser
    carl.log_in("carl", "pw-carl", code="")  # no second factor yet: the password alone
    carl.open(page)
    carl.press(f"Approve decision {decision.pk}")
    assert any("needs a second factor verified in this login" in m for m in carl.messages())
    assert carl.path == "/admin/security/second-factor/"
    decision.refresh_from_db()
    assert decision.state == "requested"
    assert carl.driver.find_elements(By.CSS_SELECTOR, ".qr-code svg")
    carl.screenshot(tmp_path / "enrol.png")

    secret = carl.shown("#otp-secret")
    carl.fill("otp_token", code_from(secret))
    carl.press("Confirm")
    assert any("authenticator app is set up" in m for m in carl.messages())
    carl.press("Make new recovery codes")
    assert len(carl.driver.find_elements(By.CSS_SELECTOR, "#recovery-codes li")) == 10
    carl.log_out()

    carl.log_in("carl", "pw-carl", code="")
    assert any("enter the code from your authenticator app" in e for e in carl.errors())
    # The code just used at enrolment cannot be used again; the app's next one is accepted.
    used = TOTPDevice.objects.get(user__username="carl", confirmed=True).last_t
    carl.log_in("carl", "pw-carl", code=code_from(secret, after=used))
    assert carl.path != "/admin/login/", carl.errors()
    carl.open(page)
    carl.press(f"Approve decision {decision.pk}")
    assert any(
        f"Decision {decision.pk} (Effect confirmed) is approved" in m for m in carl.messages()
    )
    decision.refresh_from_db()
    assert decision.decided_by == checker
