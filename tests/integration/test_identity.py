"""Identity and access (issue 14): second factor, lock-out, CSP, privileged idle timeout."""

from __future__ import annotations

import re
import time

import pytest
from axes.models import AccessAttempt, AccessLog
from django.core.management import call_command
from django.test import Client
from django.urls import get_resolver, reverse
from django_otp.plugins.otp_totp.models import TOTPDevice

from govflow.engine.models import InstanceStatus, TokenState
from govflow.identity.middleware import LAST_SEEN_KEY
from govflow.identity.policy import GATED_URL_NAMES, PRIVILEGED_PERMISSIONS, is_privileged
from recovery.models import Decision
from tests.flows import drive
from tests.identity import totp_device, totp_now, verified_login

from .test_desk_batches import checker, operator  # noqa: F401 (fixtures of bulk triage)
from .test_engine_admin import blocked, decision_form, make_user, messages_of, url

pytestmark = pytest.mark.django_db

REQUESTER_PERMS = (
    "engine.view_instance",
    "engine.operate_instance",
    "recovery.request_decision",
)
APPROVER_PERMS = ("engine.view_instance", "recovery.approve_decision")


@pytest.fixture
def requester(django_user_model):
    return make_user(django_user_model, "rhea", *REQUESTER_PERMS)


@pytest.fixture
def approver(django_user_model):
    return make_user(django_user_model, "arno", *APPROVER_PERMS)


def requested_decision(requester):
    instance = blocked()
    token = instance.tokens.get(node_id="write")
    verified_login(Client(), requester).post(
        url("instance_handoff", instance.pk, token.pk), decision_form(token)
    )
    return instance, token, Decision.objects.get()


# -- second factor ------------------------------------------------------------------------


def test_an_approval_without_a_verified_second_factor_is_refused_with_how_to_enrol(
    requester, approver
):
    instance, token, decision = requested_decision(requester)
    client = Client()
    client.force_login(approver)  # password only: no second factor in this login
    approve = url("instance_decision_approve", instance.pk, decision.pk)
    refused = client.post(approve, follow=True)
    [message] = messages_of(refused)
    assert "needs a second factor verified in this login" in message
    assert reverse("admin:identity_enrol") in message
    decision.refresh_from_db()
    token.refresh_from_db()
    assert (decision.state, token.state) == ("requested", TokenState.OUTCOME_UNKNOWN)

    done = verified_login(Client(), approver).post(
        approve, {"result_fp": decision.result_fp}, follow=True
    )
    assert any(
        f"Decision {decision.pk} (Effect confirmed) is approved" in m for m in messages_of(done)
    )
    assert drive(instance).status == InstanceStatus.COMPLETED


def test_a_decision_request_without_a_second_factor_is_refused(requester):
    instance = blocked()
    token = instance.tokens.get(node_id="write")
    client = Client()
    client.force_login(requester)
    refused = client.post(url("instance_handoff", instance.pk, token.pk), decision_form(token))
    assert refused.status_code == 302
    assert not Decision.objects.exists()


def test_publishing_a_definition_without_a_second_factor_is_refused(django_user_model):
    publisher = make_user(
        django_user_model, "pia", "engine.view_definition", "engine.publish_definition"
    )
    client = Client()
    client.force_login(publisher)
    refused = client.post(url("definition_upload"), {}, follow=True)
    assert any("needs a second factor" in m for m in messages_of(refused))


def test_who_is_privileged_is_read_from_permissions(django_user_model, settings):
    viewer = make_user(django_user_model, "vic", "engine.view_instance")
    approver = make_user(django_user_model, "ada", *APPROVER_PERMS)
    keys = make_user(django_user_model, "kim", "api.add_apikey")
    assert (is_privileged(viewer), is_privileged(approver), is_privileged(keys)) == (
        False,
        True,
        True,
    )
    settings.GOVFLOW_REQUIRE_2FA_FOR_ALL = True
    assert is_privileged(viewer)


def test_every_gated_name_is_a_url_of_the_admin():
    names = {name for name in get_resolver().reverse_dict if isinstance(name, str)} | {
        name for name in get_resolver().url_patterns[1].reverse_dict if isinstance(name, str)
    }
    missing = sorted(n for n in GATED_URL_NAMES if n not in names)
    assert not missing, f"gated URL names that no longer exist: {missing}"


DECIDING_WORDS = frozenset(
    {
        "approve",
        "approval",
        "reject",
        "request",
        "submit",
        "resolve",
        "confirm",
        "handoff",
        "upload",
        "migrate",
        "rotate",
    }
)


def admin_url_names() -> set[str]:
    admin_urls = next(
        p for p in get_resolver().url_patterns if getattr(p, "app_name", None) == "admin"
    )
    return {name for name in admin_urls.reverse_dict if isinstance(name, str)}


def test_every_admin_view_that_decides_or_grants_needs_a_second_factor():
    """A new deciding view (its URL name says approve, reject, request, …) or the add,
    change or delete page of a model whose rights are privileged is gated, or this fails:
    a list that has to be remembered is how bulk triage and compensations were missed."""
    names = admin_url_names()
    deciding = {n for n in names if DECIDING_WORDS & set(n.split("_"))}
    granting = set()
    for perm in PRIVILEGED_PERMISSIONS:
        app, code = perm.split(".")
        verb, _sep, model = code.partition("_")
        if verb in {"add", "change", "delete"}:
            granting |= {f"{app}_{model}_{v}" for v in ("add", "change", "delete")} & names
    assert {"handoffs_decisionbatch_approve", "engine_instance_cmp_approve"} <= deciding
    assert {"api_apikey_add", "events_subscription_change"} <= granting
    ungated = sorted((deciding | granting) - GATED_URL_NAMES)
    assert not ungated, (
        f"deciding or granting admin views without the second-factor gate: {ungated}"
    )


def test_a_batch_approval_without_a_verified_second_factor_changes_nothing(operator, checker):  # noqa: F811
    from govflow.handoffs.models import BatchState, DecisionBatch

    from .test_desk_batches import previewed, submission, uncertain

    steps = uncertain(2)
    unverified = Client()
    unverified.force_login(operator)
    preview = previewed(unverified, steps)  # reading is never refused
    submit = reverse("admin:handoffs_decisionbatch_submit")
    refused = unverified.post(submit, submission(preview, steps), follow=True)
    assert any("needs a second factor" in m for m in messages_of(refused))
    assert not DecisionBatch.objects.exists()

    verified = verified_login(Client(), operator)
    verified.post(submit, submission(previewed(verified, steps), steps))
    batch = DecisionBatch.objects.get()
    checking = Client()
    checking.force_login(checker)
    approve = reverse("admin:handoffs_decisionbatch_approve", args=[batch.pk])
    refused = checking.post(approve, follow=True)
    assert any("needs a second factor" in m for m in messages_of(refused))
    batch.refresh_from_db()
    assert batch.state == BatchState.REQUESTED
    assert not Decision.objects.filter(decided_by=checker).exists()

    verified_login(checking, checker).post(approve)
    batch.refresh_from_db()
    assert batch.state == BatchState.APPROVED
    assert Decision.objects.filter(decided_by=checker).count() == 2


def test_the_login_asks_for_the_code_of_a_user_with_a_device(approver):
    device = totp_device(approver)
    login = reverse("admin:login")
    form = {"username": "arno", "password": "pw", "next": "/admin/"}
    without = Client().post(login, form)
    assert without.status_code == 200
    assert "enter the code from your authenticator app" in without.content.decode()
    wrong = Client().post(login, {**form, "otp_token": "000000"})
    assert "That code is not valid" in wrong.content.decode()
    device.refresh_from_db()
    device.throttle_reset()  # a wrong code delays the next try (django-otp); no waiting here
    client = Client()
    right = client.post(login, {**form, "otp_token": totp_now(device)})
    assert right.status_code == 302
    assert client.get(reverse("admin:identity_enrol")).context["verified"] is True


def test_a_user_without_a_device_logs_in_with_the_password(django_user_model):
    make_user(django_user_model, "vic", "engine.view_instance")
    response = Client().post(reverse("admin:login"), {"username": "vic", "password": "pw"})
    assert response.status_code == 302


def test_enrolment_shows_a_qr_code_and_confirms_with_the_first_code(approver):
    client = Client()
    client.force_login(approver)
    page = client.get(reverse("admin:identity_enrol"))
    body = page.content.decode()
    assert "<svg" in body and "otpauth://totp/" in body
    device = TOTPDevice.objects.get(user=approver)
    assert device.confirmed is False
    bad = client.post(reverse("admin:identity_enrol"), {"otp_token": "123"})
    assert "does not match" in bad.content.decode()
    device.refresh_from_db()
    device.throttle_reset()
    good = client.post(reverse("admin:identity_enrol"), {"otp_token": totp_now(device)})
    assert good.status_code == 302
    device.refresh_from_db()
    assert device.confirmed is True
    codes = client.post(reverse("admin:identity_recovery_codes")).content.decode()
    found = re.findall(r"<li><code>([^<]+)</code></li>", codes)
    assert len(found) == 10
    # a recovery code logs in once, in place of the app's code
    login = {"username": "arno", "password": "pw", "otp_token": found[0]}
    assert Client().post(reverse("admin:login"), login).status_code == 302
    assert Client().post(reverse("admin:login"), login).status_code == 200


# -- lock-out -----------------------------------------------------------------------------


def test_repeated_failures_lock_the_user_out_until_an_administrator_unlocks(
    approver, settings, caplog
):
    settings.AXES_FAILURE_LIMIT = 3
    login = reverse("admin:login")
    for _ in range(2):
        assert Client().post(login, {"username": "arno", "password": "bad"}).status_code == 200
    locked = Client().post(login, {"username": "arno", "password": "bad"})
    assert locked.status_code == 429
    assert "Too many failed logins" in locked.content.decode()
    assert "login locked out: username='arno'" in caplog.text
    # the right password does not help while locked
    assert Client().post(login, {"username": "arno", "password": "pw"}).status_code == 429
    assert AccessAttempt.objects.filter(username="arno").exists()

    call_command("axes_reset_username", "arno")
    assert Client().post(login, {"username": "arno", "password": "pw"}).status_code == 302
    assert AccessLog.objects.filter(username="arno").exists()


def test_failures_from_one_address_lock_the_address_for_every_username(django_user_model, settings):
    settings.AXES_FAILURE_LIMIT = 3
    make_user(django_user_model, "vic", "engine.view_instance")
    login = reverse("admin:login")
    for name in ("a1", "a2", "a3"):
        Client().post(login, {"username": name, "password": "bad"})
    assert Client().post(login, {"username": "vic", "password": "pw"}).status_code == 429
    other = Client(REMOTE_ADDR="10.9.9.9")
    assert other.post(login, {"username": "vic", "password": "pw"}).status_code == 302


def test_logins_and_logouts_are_recorded(approver):
    client = Client()
    client.post(reverse("admin:login"), {"username": "arno", "password": "pw"})
    client.post(reverse("admin:logout"))
    entry = AccessLog.objects.get(username="arno")
    assert entry.attempt_time is not None and entry.logout_time is not None


# -- browser hardening --------------------------------------------------------------------


def test_admin_pages_carry_a_csp_without_unsafe_inline_scripts(approver):
    client = verified_login(Client(), approver)
    for path in (reverse("admin:login"), reverse("admin:index"), url("instance_changelist")):
        response = client.get(path)
        policy = response.headers["Content-Security-Policy"]
        script = re.search(r"script-src ([^;]*)", policy).group(1)
        assert script.split()[0] == "'self'" and "'unsafe-inline'" not in script
        assert "frame-ancestors 'none'" in policy and "object-src 'none'" in policy


def test_a_privileged_session_ends_after_inactivity(approver, django_user_model, settings):
    settings.GOVFLOW_PRIVILEGED_IDLE_SECONDS = 900
    client = verified_login(Client(), approver)
    assert client.get(reverse("admin:index")).status_code == 200
    session = client.session
    session[LAST_SEEN_KEY] = time.time() - 901
    session.save()
    expired = client.get(reverse("admin:index"), follow=True)
    assert expired.redirect_chain[0][0].startswith(reverse("admin:login"))
    assert any("logged out after 15 minutes without activity" in m for m in messages_of(expired))

    viewer = make_user(django_user_model, "vic", "engine.view_instance")
    plain = Client()
    plain.force_login(viewer)
    session = plain.session
    session[LAST_SEEN_KEY] = time.time() - 901
    session.save()
    assert plain.get(reverse("admin:index")).status_code == 200


def test_nobody_sees_another_persons_totp_secret_in_the_admin(django_user_model):
    """An administrator may delete a device, never read its secret or QR code; a device
    that does not exist is refused alike, never a server error."""
    from django.contrib.auth.models import Group

    from tests.identity import totp_device

    owner = django_user_model.objects.create_user("owen", password="pw", is_staff=True)
    device = totp_device(owner)
    admin_user = django_user_model.objects.create_user("ada", password="pw", is_staff=True)
    admin_user.groups.add(Group.objects.get(name="Administrator"))
    client = verified_login(Client(), admin_user)
    for view in ("config", "qrcode"):
        for pk in (device.pk, device.pk + 1000):
            response = client.get(f"/admin/otp_totp/totpdevice/{pk}/{view}/")
            assert response.status_code == 403, (view, pk)
            assert device.key not in response.content.decode()
