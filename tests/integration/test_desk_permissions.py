"""Every admin URL, walked: anonymous visitors go to the login, a staff user without a
role is refused (403) or shown nothing, and a user of another tenant — holding every role —
finds none of this tenant's objects (404). Each URL of the admin must be classified below,
so a new page fails here until someone says how it is guarded."""

from __future__ import annotations

import re

import pytest
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import URLPattern, URLResolver, reverse
from django.utils import timezone

from govflow.engine.models import Definition
from govflow.engine.tenancy import ROLES, tenant_group_name
from govflow.events.models import Delivery
from recovery.models import Checkpoint
from tests.desk_rows import FP, definitions, detail_objects
from tests.identity import verified_login

pytestmark = pytest.mark.django_db

TENANT_MODELS = {
    "engine_instance": "instance",
    "engine_token": "token",
    "engine_timer": "timer",
    "engine_triggerdelivery": "triggerdelivery",
    "engine_incident": "incident",
    "recovery_operation": "operation",
    "recovery_checkpoint": "checkpoint",
    "recovery_lease": "lease",
    "recovery_integrityincident": "integrityincident",
    "recovery_decision": "decision",
    "api_apikey": "apikey",
    "govflow_demo_decisionnote": "decisionnote",
    "handoffs_decisionbatch": "decisionbatch",
    # Webhooks (issue 13 part 3): a tenant's subscriptions and their deliveries.
    "events_subscription": "subscription",
    "events_delivery": "delivery",
    "events_event": "event",
}
GLOBAL_MODELS = {
    "engine_definition": "definition",
    "auth_user": "user",
    "auth_group": "group",
    "django_q_schedule": None,
    "django_q_success": None,
    "django_q_failure": None,
    "django_q_ormq": None,
    # Second factors and login records (issue 14): administrators only.
    "otp_totp_totpdevice": None,
    "otp_static_staticdevice": None,
    "axes_accessattempt": None,
    "axes_accessfailurelog": None,
    "axes_accesslog": None,
    # Rights changes waiting for a second administrator (issue 14 part 3).
    "identity_rightschange": "rightschange",
    # The Dataflow demo module's own records (issue 13 part 2): its runs, its fault switch.
    "dataflow_dataflowrun": None,
    "dataflow_faultswitch": None,
}
# Pages of the site itself: expected statuses for a staff user without a role.
SITE = {
    "index": {200},  # the queue says "no desk role", and shows nothing
    "records": {403},
    "app_list": {403, 404},
    "view_on_site": {404},
    "jsi18n": {200},
    "password_change": {200},  # one's own password
    "password_change_done": {200},
    "identity_enrol": {200},  # one's own second factor
    "identity_recovery_codes": {200},
}
PUBLIC = {"login", "logout", "autocomplete"}
# Parameters of the custom pages and what they name (tenant-scoped objects).
PARAMS = {
    "instance_id": "instance",
    "token_id": "token",
    "decision_id": "decision",
    "migration_id": "migration",
    "evidence_id": "evidence",
    "change_id": "rightschange",
}
INCIDENT_PARAM = {  # incident_id names an engine incident on the instance page
    "engine_instance_incident_resolve": "incident",
}
POST_ONLY = re.compile(
    r"_(cancel|retry|approval|handoff|approve|reject|withdraw|resolve|migrate|request"
    r"|preview|submit|confirm|compensate|rotate|redeliver)$"
)


def admin_urls():
    """(name, route) of every URL the admin serves, with their parameters."""

    def walk(patterns, prefix=""):
        for p in patterns:
            if isinstance(p, URLResolver):
                yield from walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                yield p.name, prefix + str(p.pattern)

    return list(walk(admin.site.get_urls()))


def model_of(name: str) -> tuple[str, str] | None:
    """The model prefix (e.g. ``engine_token``) of a model admin's URL name, and the rest."""
    for prefix in (*TENANT_MODELS, *GLOBAL_MODELS):
        if name.startswith(prefix + "_"):
            return prefix, name[len(prefix) + 1 :]
    return None


def kind_of(name: str | None, route: str) -> str:
    """How a URL is guarded: public, site, global (no tenant) or tenant (its object's)."""
    if name is None:
        # The stock "<model>/<object_id>/" redirect to the change page, and the catch-all.
        return "redirect" if route.endswith("<path:object_id>/") else "catch_all"
    if name in PUBLIC:
        return "public"
    if name in SITE:
        return "site"
    found = model_of(name)
    assert found, f"The admin URL {name!r} ({route}) is not classified in this test."
    prefix, _ = found
    if prefix in GLOBAL_MODELS:
        return "global"
    return "tenant" if "<" in route else "list"


def member(django_user_model, username, tenant, *roles):
    user = django_user_model.objects.create_user(username=username, password="pw", is_staff=True)
    user.groups.add(Group.objects.get_or_create(name=tenant_group_name(tenant))[0])
    user.groups.add(*Group.objects.filter(name__in=roles))
    return user


def client_of(user) -> Client:
    """Logged in with a second factor verified (issue 14), so the walk meets the desk's
    own checks: role, tenant and method, not the enrolment page."""
    return verified_login(Client(), user)


@pytest.fixture
def world(django_user_model):
    definitions()
    requester = member(django_user_model, "rita", "north", *ROLES)
    ids = detail_objects("north", requester=requester)
    instance_id = ids["instance"]
    ids["checkpoint"] = Checkpoint.objects.create(
        subject_type="govflow.instance",
        subject_id=str(instance_id),
        seq=1,
        kind="started",
        fact="{}",
        fact_fp=FP,
        prev_link=FP,
        link=FP,
        key_id="k1",
        recorded_at=timezone.now(),
    ).pk
    ids["definition"] = Definition.objects.first().pk
    ids["migration"] = 999_999  # none exists: the instance is checked first
    ids["apikey"] = make_key("north")
    ids["decisionnote"] = make_note(instance_id)
    ids["decisionbatch"] = make_batch("north", requester, ids)
    ids["user"] = requester.pk
    ids["group"] = Group.objects.get(name="Operator").pk
    ids["rightschange"] = make_rights_change(django_user_model, requester)
    ids["subscription"], ids["delivery"] = make_dead_letter("north", instance_id)
    ids["event"] = Delivery.objects.get(pk=ids["delivery"]).event_id
    return ids


def make_dead_letter(tenant: str, instance_id: int) -> tuple[int, int]:
    """A tenant's webhook and one dead-lettered delivery of it."""
    from django.db.models.functions import Now

    from govflow.events.models import Delivery, Event
    from govflow.events.services import subscription_create

    subscription = subscription_create(
        name="Case system", url="https://127.0.0.1/hook", tenant=tenant
    ).subscription
    event = Event.objects.create(
        type="instance.started",
        tenant=tenant,
        instance_id=instance_id,
        seq=99,
        created_at=Now(),
        fanned_out=True,
    )
    delivery = Delivery.objects.create(
        subscription=subscription,
        event=event,
        instance_id=instance_id,
        seq=99,
        state="dead",
        attempts=8,
        next_attempt_at=Now(),
        created_at=Now(),
        updated_at=Now(),
        dead_at=Now(),
        last_outcome="HTTP 500",
    )
    return subscription.pk, delivery.pk


def make_rights_change(django_user_model, requester) -> int:
    from govflow.identity.models import RightsChange

    receiver = django_user_model.objects.create_user(username="rolf", password="pw")
    return RightsChange.objects.create(
        kind="group_add",
        user=receiver,
        group=Group.objects.get(name="Approver"),
        requested_by=requester,
    ).pk


def make_key(tenant: str) -> str:
    from govflow.api.models import ApiKey

    key, _ = ApiKey.objects.create_key(name="k", tenant=tenant, scopes=["all"])
    return key.pk


def make_batch(tenant: str, requester, ids: dict) -> int:
    """A bulk-triage batch of the tenant, holding its decision."""
    from govflow.engine.models import Token
    from govflow.handoffs.models import BatchItem, DecisionBatch

    token = Token.objects.get(pk=ids["token"])
    batch = DecisionBatch.objects.create(
        kind="effect_absent",
        action="demo.x",
        definition=token.instance.definition,
        tenant=tenant,
        fingerprint=FP,
        rationale="r",
        requested_by=requester,
        requested_at=timezone.now(),
    )
    BatchItem.objects.create(
        batch=batch,
        decision_id=ids["decision"],
        token=token,
        operation_key="op-x",
        revision=1,
        reference="line 1",
    )
    return batch.pk


def make_note(instance_id: int) -> int:
    from govflow.demo.models import DecisionNote

    return DecisionNote.objects.create(
        instance_id=instance_id,
        step_id="s",
        idempotency_key="ik",
        subject="BP-1",
        kind=DecisionNote._meta.get_field("kind").choices[0][0],
        text="t",
    ).pk


def url_for(name: str | None, route: str, ids: dict) -> str:
    if name == "app_list":
        return reverse("admin:app_list", kwargs={"app_label": "engine"})
    if name == "view_on_site":
        return "/admin/r/1/1/"
    if name is None:
        target = {**TENANT_MODELS, **GLOBAL_MODELS}[prefix_of_route(route)]
        return "/admin/" + route.replace("<path:object_id>", quote(str(ids.get(target, 1))))
    found = model_of(name)
    kwargs = {}
    for param in re.findall(r"<(?:\w+:)?(\w+)>", route):
        if param == "pk":  # a second-factor device's own pages (administrators only)
            kwargs[param] = "1"
        elif param in ("object_id", "id"):
            target = TENANT_MODELS.get(found[0]) or GLOBAL_MODELS.get(found[0])
            kwargs[param] = quote(str(ids.get(target, 1))) if target else "1"
        elif param == "key":  # a compensation's operation key (none: the page is refused)
            kwargs[param] = "cmp-" + "0" * 64
        elif param == "incident_id":
            recovery = found[0].startswith("recovery")
            default = "integrityincident" if recovery else "incident"
            kwargs[param] = ids[INCIDENT_PARAM.get(name, default)]
        else:
            kwargs[param] = ids[PARAMS[param]]
    return reverse(f"admin:{name}", kwargs=kwargs)


def is_post_only(name: str | None) -> bool:
    return bool(name and POST_ONLY.search(name) and not name.endswith("_changelist"))


def prefix_of_route(route: str) -> str:
    app, model = route.split("/")[:2]
    return f"{app}_{model}"


def cases():
    return [
        (name, route)
        for name, route in admin_urls()
        if kind_of(name, route) not in ("public", "catch_all")
    ]


def other_tenant_cases():
    """URLs naming one of the tenant's objects."""
    return [
        (name, route)
        for name, route in cases()
        if kind_of(name, route) == "tenant"
        or (kind_of(name, route) == "redirect" and prefix_of_route(route) in TENANT_MODELS)
    ]


def list_cases():
    return [(n, r) for n, r in cases() if kind_of(n, r) == "list" and n.endswith("_changelist")]


def test_every_admin_url_is_classified():
    kinds = {kind_of(name, route) for name, route in admin_urls()}
    assert {"site", "tenant", "global", "list"} <= kinds


@pytest.mark.parametrize(("name", "route"), cases(), ids=lambda v: str(v))
def test_anonymous_visitors_go_to_the_login(client, world, name, route):
    target = url_for(name, route, world)
    response = client.post(target, {}) if is_post_only(name) else client.get(target)
    assert response.status_code == 302, target
    assert response["Location"].startswith(reverse("admin:login")), target


@pytest.mark.parametrize(("name", "route"), cases(), ids=lambda v: str(v))
def test_a_user_without_a_role_is_refused(django_user_model, world, name, route):
    nobody = client_of(member(django_user_model, "nina", "north"))
    target = url_for(name, route, world)
    if is_post_only(name):
        response = nobody.post(target, {}, follow=True)
    else:
        response = nobody.get(target, follow=True)
    if response.redirect_chain and response.redirect_chain[-1][0] == reverse("admin:index"):
        # The stock "does not exist" redirect home (a library's table): nothing is shown.
        assert response.context["sections"] == []
        return
    # 404 for a row of a tenant's the user does not work for: not shown either.
    allowed = SITE.get(name, {403, 404} if kind_of(name, route) != "global" else {403})
    assert response.status_code in allowed, (target, response.status_code)


@pytest.mark.parametrize(("name", "route"), other_tenant_cases(), ids=lambda v: str(v))
def test_another_tenants_object_is_not_found(django_user_model, world, name, route):
    stranger = client_of(member(django_user_model, "sven", "south", *ROLES))
    target = url_for(name, route, world)

    def ask(client):
        if is_post_only(name):
            return client.post(target, {"reason": "x", "rationale": "x"}, follow=True)
        return client.get(target, follow=True)

    status = ask(stranger).status_code
    if status == 403:
        # Refused to everyone alike (nobody deletes a record; the demo's notes need the
        # demo's permission): the answer does not depend on the tenant.
        rita = client_of(django_user_model.objects.get(username="rita"))
        assert ask(rita).status_code == 403, target
    else:
        assert status == 404, (target, status)


@pytest.mark.parametrize(("name", "route"), list_cases(), ids=lambda v: str(v))
def test_lists_show_only_my_tenants_rows(django_user_model, world, name, route):
    prefix = model_of(name)[0]
    target = TENANT_MODELS[prefix]
    change = reverse(f"admin:{prefix}_change", args=[quote(str(world[target]))])
    stranger = client_of(member(django_user_model, "sven", "south", *ROLES))
    response = stranger.get(url_for(name, route, world))
    if response.status_code == 403:  # the demo's notes need the demo's own permission
        assert stranger.get(change).status_code != 200
        return
    assert response.status_code == 200
    assert change not in response.content.decode()
    # The row is there, for whoever may see it (a superuser sees every tenant's).
    root = django_user_model.objects.create_superuser("root", password="pw")
    assert change in client_of(root).get(url_for(name, route, world)).content.decode()


@pytest.mark.parametrize(
    ("name", "route"), [c for c in cases() if is_post_only(c[0])], ids=lambda v: str(v)
)
def test_a_get_on_an_action_goes_back_to_its_page_never_a_bare_405(
    django_user_model, world, name, route
):
    """A reload of the page a validation error rendered at an action's URL."""
    rita = client_of(django_user_model.objects.get(username="rita"))
    response = rita.get(url_for(name, route, world))
    assert response.status_code != 405
    if name.startswith("engine_instance_") and "migration_" not in name:
        page = reverse("admin:engine_instance_change", args=[world["instance"]])
        assert (response.status_code, response["Location"]) == (302, page)
        assert rita.get(page).status_code == 200
    elif name.startswith("recovery_integrityincident_"):
        page = reverse("admin:recovery_integrityincident_change", args=[world["integrityincident"]])
        assert (response.status_code, response["Location"]) == (302, page)
