"""The desk in plain words: case fields in the list and the search, a start form generated
from the definition's variables schema (types, required marks, examples, refusals)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from govflow.demo.sample import sample_variables
from govflow.engine.models import Instance, WaitKind
from govflow.engine.services.definitions import (
    definition_publish,
    definitions_load_app_workflows,
)
from govflow.engine.services.instances import instance_start
from govflow.handoffs.services.desk import approval_decide
from tests.engine_helpers import user_with
from tests.flows import action, linear
from tests.identity import verified_login
from tests.integration.test_demo import drive, run_to_approval, waiting
from tests.tenancy import TEST_TENANTS, bind_only

pytestmark = pytest.mark.django_db

OPERATOR = ("engine.view_instance", "engine.start_instance", "engine.view_definition")
LIST = reverse("admin:engine_instance_changelist")
START = reverse("admin:engine_instance_start")


@pytest.fixture(autouse=True)
def demo_store(tmp_path, settings):
    settings.GOVFLOW_DEMO_STORE = str(tmp_path / "demo-registry.sqlite3")


@pytest.fixture
def published():
    return {d.key: d for d in definitions_load_app_workflows() if d.key.startswith("demo.")}


@pytest.fixture
def permits_officer(django_user_model):
    return user_with(django_user_model, "officer", "govflow_demo.approve_permit")


@pytest.fixture
def olga(django_user_model):
    """An operator of two offices (her groups tenant:default and tenant:city-hall)."""
    user = user_with(django_user_model, "olga", *OPERATOR)
    bind_only(user, "default", "city-hall")
    return user


@pytest.fixture
def desk(olga) -> Client:
    client = Client()
    client.force_login(olga)
    return client


def permit(published, name="Tomasz Nowak", parcel="UTR-C-1907") -> Instance:
    variables = sample_variables(applicant=name, parcel=parcel)
    return instance_start(definition=published["demo.building_permit"], variables=variables)


def decided(published, officer, approved: bool) -> Instance:
    instance = run_to_approval(published["demo.building_permit"])
    approval_decide(
        instance_id=instance.pk,
        token_id=waiting(instance, WaitKind.APPROVAL).pk,
        actor=officer,
        approved=approved,
        note="Decided.",
    )
    return drive(instance)


def test_the_case_fields_are_stored_when_it_starts_and_when_variables_change(published):
    instance = permit(published)
    assert instance.case_map == {"applicant": "Tomasz Nowak", "parcel": "UTR-C-1907"}
    assert str(instance) == f"Building permit #{instance.pk} — Tomasz Nowak, UTR-C-1907"
    instance = drive(instance)  # registered: the application number is a variable now
    number = instance.variables["application"]["id"]
    assert instance.case_map["application"] == number
    assert number.lower() in instance.case_text


def test_search_finds_a_permit_by_the_applicants_name_and_its_number(published, desk):
    nowak = drive(permit(published))
    permit(published, name="Maria Jansen", parcel="ASD-K-4821")
    page = desk.get(LIST, {"q": "Nowak"})
    assert list(page.context["cl"].result_list) == [nowak]
    number = nowak.case_map["application"]
    assert list(desk.get(LIST, {"q": number}).context["cl"].result_list) == [nowak]
    assert list(desk.get(LIST, {"q": "UTR-C-1907"}).context["cl"].result_list) == [nowak]
    text = page.content.decode()
    assert f"Building permit #{nowak.pk} — Tomasz Nowak" in text
    assert "Applicant: Tomasz Nowak" in text


def test_refused_and_approved_permits_differ_in_the_list(published, permits_officer, desk):
    approved = decided(published, permits_officer, True)
    refused = decided(published, permits_officer, False)
    assert (approved.status, refused.status) == ("completed", "completed")
    assert (approved.case_map["outcome"], refused.case_map["outcome"]) == ("Approved", "Refused")
    page = desk.get(LIST, {"definition__key": "demo.building_permit"})
    text = page.content.decode()
    # Filtered to the permit, its case fields are columns of their own.
    for heading in ("Applicant", "Parcel", "Application number", "Outcome"):
        assert f">{heading}</a>" in text or f">{heading}</span>" in text, heading
    assert '<td class="field-case_outcome">Approved</td>' in text
    assert '<td class="field-case_outcome">Refused</td>' in text
    assert "Completed" in text  # the status in words, not its code
    assert list(desk.get(LIST, {"q": "refused"}).context["cl"].result_list) == [refused]


def test_the_instance_page_names_the_case_and_the_permission_in_words(published, django_user_model):
    instance = run_to_approval(published["demo.building_permit"])
    client = Client()
    client.force_login(user_with(django_user_model, "vera", "engine.view_instance"))
    page = client.get(reverse("admin:engine_instance_change", args=[instance.pk]))
    text = page.content.decode()
    name = instance.case_map["applicant"]
    assert page.context["title"].startswith(f"Building permit #{instance.pk} — {name}")
    assert "Permits officer decides" in text  # the node's title, not 'approval'
    assert "Can approve building permits" in text or "Can approve" in text


# -- the start form -----------------------------------------------------------------------


def test_the_start_form_asks_for_each_value_typed_and_marked_as_the_schema_says(published, desk):
    definition = published["demo.building_permit"]
    pick = desk.get(START)
    assert "Building permit (demo.building_permit v4)" in pick.content.decode()
    page = desk.get(START, {"definition": definition.pk})
    form = page.context["form"]
    fields = form.fields
    assert not form.raw
    assert type(fields["var.applicant.name"]).__name__ == "CharField"
    assert fields["var.applicant.name"].required
    assert fields["var.applicant.name"].label == "Applicant: Name"
    assert type(fields["var.project.floor_area_m2"]).__name__ == "IntegerField"
    assert fields["var.project.floor_area_m2"].min_value == 1
    assert fields["var.fee.currency"].choices == [("", "—"), ('"EUR"', "EUR")]
    assert fields["var.parcel.id"].help_text == "As the land registry writes it."
    text = page.content.decode()
    assert 'placeholder="T. Nowak"' in text and 'placeholder="UTR-C-1907"' in text
    assert text.count("(required)") == len([f for f in fields.values() if f.required])
    # Her two tenants, neither preselected: she says which office the case is for.
    assert fields["tenant"].choices == [
        ("", "Choose the tenant"),
        ("city-hall", "city-hall"),
        ("default", "default"),
    ]
    assert fields["tenant"].initial is None and fields["tenant"].required


FILLED = {
    "tenant": "default",
    "var.applicant.name": "Tomasz Nowak",
    "var.applicant.email": "t.nowak@example.org",
    "var.parcel.id": "UTR-C-1907",
    "var.parcel.address": "Oudegracht 45, Utrecht",
    "var.project.description": "Dormer",
    "var.project.floor_area_m2": "6",
    "var.fee.amount_cents": "20600",
    "var.fee.currency": '"EUR"',
}


def test_a_filled_form_starts_the_case_with_nested_typed_variables(published, desk):
    definition = published["demo.building_permit"]
    response = desk.post(START, {"definition": definition.pk, **FILLED})
    instance = Instance.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:engine_instance_change", args=[instance.pk])
    assert instance.variables == {
        "applicant": {"name": "Tomasz Nowak", "email": "t.nowak@example.org"},
        "parcel": {"id": "UTR-C-1907", "address": "Oudegracht 45, Utrecht"},
        "project": {"description": "Dormer", "floor_area_m2": 6},
        "fee": {"amount_cents": 20600, "currency": "EUR"},
    }
    assert instance.tenant == "default"


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"var.applicant.name": ""}, "var.applicant.name", "This field is required."),
        ({"var.project.floor_area_m2": "six"}, "var.project.floor_area_m2", "whole number"),
        ({"var.project.floor_area_m2": "0"}, "var.project.floor_area_m2", "greater than or"),
        ({"var.fee.currency": '"USD"'}, "var.fee.currency", "Select a valid choice"),
        ({"var.applicant.email": "ab"}, "var.applicant.email", "is too short"),
        ({"tenant": "elsewhere"}, "tenant", "Select a valid choice"),
        ({"tenant": "north"}, "tenant", "Select a valid choice"),  # a tenant, not hers
        ({"tenant": ""}, "tenant", "This field is required."),
    ],
)
def test_bad_input_is_shown_on_its_field_and_nothing_starts(published, desk, change, field, says):
    definition = published["demo.building_permit"]
    response = desk.post(START, {"definition": definition.pk, **FILLED, **change})
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert any(says in e for e in errors[field]), errors
    assert not Instance.objects.exists()


def test_a_schema_the_form_cannot_express_is_entered_as_json(desk):
    schema = {"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}
    definition = definition_publish(
        document=linear(action("write"), key="tests.oneof", variables_schema=schema)
    )
    page = desk.get(START, {"definition": definition.pk})
    assert page.context["form"].raw and "variables" in page.context["form"].fields
    assert "oneOf" in page.content.decode()  # the schema is shown to write against
    bad = desk.post(START, {"definition": definition.pk, "tenant": "default", "variables": "{}"})
    assert bad.status_code == 200 and not Instance.objects.exists()
    good = desk.post(
        START, {"definition": definition.pk, "tenant": "default", "variables": '{"a": 1}'}
    )
    assert good.status_code == 302 and Instance.objects.get().variables == {"a": 1}


def test_the_start_page_refuses_what_is_not_a_published_definition(desk):
    page = desk.get(START, {"definition": "999999"})
    assert page.status_code == 200 and "pick" in page.context
    assert page.context["pick"].errors["definition"]
    assert desk.post(START, {"definition": "x", "tenant": "default"}).status_code == 200
    assert not Instance.objects.exists()


# -- the tenant: the operator's own, from her tenant groups ------------------------------


def test_the_tenant_is_chosen_for_an_operator_of_one_office(published, olga):
    bind_only(olga, "city-hall")
    desk = verified_login(Client(), olga)
    definition = published["demo.building_permit"]
    field = desk.get(START, {"definition": definition.pk}).context["form"].fields["tenant"]
    assert field.choices == [("city-hall", "city-hall")] and field.initial == "city-hall"
    response = desk.post(START, {"definition": definition.pk, **FILLED, "tenant": "city-hall"})
    assert response.status_code == 302 and Instance.objects.get().tenant == "city-hall"


def test_a_superuser_chooses_among_every_tenant_a_group_names(published, olga, django_user_model):
    root = django_user_model.objects.create_superuser("root", password="pw")
    desk = verified_login(Client(), root)
    definition = published["demo.building_permit"]
    field = desk.get(START, {"definition": definition.pk}).context["form"].fields["tenant"]
    # user_with made a tenant: group for each test tenant; the superuser belongs to none.
    assert field.choices == [("", "Choose the tenant")] + [(t, t) for t in sorted(TEST_TENANTS)]


def test_an_operator_of_no_tenant_is_told_why_she_cannot_start(published, olga):
    bind_only(olga)
    desk = verified_login(Client(), olga)
    definition = published["demo.building_permit"]
    page = desk.get(START, {"definition": definition.pk})
    assert page.status_code == 200 and "form" not in page.context
    text = page.content.decode()
    assert "You work for no tenant" in text and "<code>tenant:</code>" in text
    response = desk.post(START, {"definition": definition.pk, **FILLED})
    assert response.status_code == 200 and "You work for no tenant" in response.content.decode()
    assert not Instance.objects.exists()
