"""List filters (django-filter), and the case-variable filter ``var.<path>=<value>``.

A filter value that cannot be read (an unknown status, a date that is no date) is a 400
``malformed-request`` naming the parameter, never an empty list that looks like an answer.

Case variables: ``?var.applicant.name=Nowak`` keeps the instances whose variable
``applicant.name`` equals ``Nowak``. The path is dotted names (letters, digits and ``_``,
not starting with a digit; at most 8 levels); at most 5 such filters, values of at most 200
characters. A value also matches the JSON ``true``, ``false``, ``null`` or integer it
spells: ``var.fee.amount_cents=1500`` matches the number 1500 and the string "1500".
"""

from __future__ import annotations

import datetime as dt
import re

import django_filters
from django import forms
from django.db.models import Q, QuerySet
from django.db.models.fields.json import KeyTransform
from django_filters.fields import IsoDateTimeField
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import extend_schema_field

from govflow.engine.models import Definition, Instance, InstanceStatus

from .problems import ApiProblem

VAR_PREFIX = "var."
VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}\Z")
VAR_INTEGER = re.compile(r"^-?[0-9]{1,15}\Z")
MAX_VAR_FILTERS = 5
MAX_VAR_DEPTH = 8
MAX_VAR_VALUE = 200
_JSON_WORDS = {"true": True, "false": False, "null": None}


class InstantField(IsoDateTimeField):
    """An ISO 8601 date-time (an offset is best; without one, UTC), within years 1-9999."""

    def to_python(self, value):
        try:
            result = super().to_python(value)
            if result is not None:
                result.astimezone(dt.UTC)  # refuses what a database cannot store either
        except (OverflowError, ValueError):
            raise forms.ValidationError(
                "Enter an ISO 8601 date-time between the years 1 and 9999, "
                "e.g. 2026-05-01T12:00:00Z."
            ) from None
        return result


class InstantFilter(django_filters.IsoDateTimeFilter):
    field_class = InstantField


class IntegerFilter(django_filters.NumberFilter):
    """A whole number between ``min_value`` and ``max_value``, documented with its bounds
    (django-filter's ``NumberFilter`` also reads '1.5' and '1e3', and drf-spectacular
    documents it as any number)."""

    field_class = forms.IntegerField

    def __init__(self, *, min_value: int, max_value: int, **kwargs):
        super().__init__(min_value=min_value, max_value=max_value, **kwargs)
        extend_schema_field({"type": "integer", "minimum": min_value, "maximum": max_value})(self)


class TextFilter(django_filters.CharFilter):
    """An exact text of 1 to ``max_length`` characters, documented so (an empty value is
    refused: ``FilterBackend``)."""

    def __init__(self, *, max_length: int, **kwargs):
        super().__init__(max_length=max_length, **kwargs)
        extend_schema_field({"type": "string", "minLength": 1, "maxLength": max_length})(self)


class StrictBooleanFilter(django_filters.ChoiceFilter):
    """``true`` or ``false``, nothing else (django-filter's own also reads 'null', '1'...)."""

    def __init__(self, **kwargs):
        super().__init__(choices=[("true", "true"), ("false", "false")], **kwargs)


class DefinitionFilter(django_filters.FilterSet):
    key = TextFilter(
        field_name="key", max_length=120, help_text="Only versions of this definition key."
    )

    class Meta:
        model = Definition
        fields: list[str] = []


class InstanceFilter(django_filters.FilterSet):
    status = django_filters.MultipleChoiceFilter(
        choices=InstanceStatus.choices,
        help_text="Only instances in this status; repeat it for several.",
    )
    definition = TextFilter(
        field_name="definition__key",
        max_length=120,
        help_text="Only instances of this definition key.",
    )
    definition_version = IntegerFilter(
        field_name="definition__version",
        min_value=1,
        max_value=2_147_483_647,
        help_text="Only instances of this version (with 'definition').",
    )
    created_after = InstantFilter(
        field_name="created_at", lookup_expr="gte", help_text="Created at or after."
    )
    created_before = InstantFilter(
        field_name="created_at", lookup_expr="lt", help_text="Created before."
    )
    updated_after = InstantFilter(
        field_name="updated_at", lookup_expr="gte", help_text="Last changed at or after."
    )
    updated_before = InstantFilter(
        field_name="updated_at", lookup_expr="lt", help_text="Last changed before."
    )

    class Meta:
        model = Instance
        fields: list[str] = []


def variable_filters(params) -> list[tuple[list[str], str]]:
    """The ``var.<path>=<value>`` pairs of a query, checked; a bad one is a 400."""
    found = []
    for name in params:
        if not name.startswith(VAR_PREFIX):
            continue
        parts = name[len(VAR_PREFIX) :].split(".")
        values = params.getlist(name)
        if len(parts) > MAX_VAR_DEPTH or not all(VAR_NAME.match(p) for p in parts):
            raise _bad(
                name,
                f"a case-variable filter is var.<path>, the path being at most "
                f"{MAX_VAR_DEPTH} dotted names of letters, digits and '_' (not starting "
                "with a digit), e.g. var.applicant.name",
            )
        if len(values) != 1:
            raise _bad(name, "give each case-variable filter once")
        value = values[0]
        if len(value) > MAX_VAR_VALUE or "\x00" in value:
            raise _bad(name, f"a value is at most {MAX_VAR_VALUE} characters, without NUL")
        found.append((parts, value))
    if len(found) > MAX_VAR_FILTERS:
        raise _bad("var.*", f"at most {MAX_VAR_FILTERS} case-variable filters at once")
    return found


def filter_variables(queryset: QuerySet, params) -> QuerySet:
    for index, (parts, value) in enumerate(variable_filters(params)):
        expression = "variables"
        for part in parts:
            expression = KeyTransform(part, expression)
        alias = f"_case_var_{index}"
        queryset = queryset.alias(**{alias: expression})
        matches = Q(**{alias: value})
        if value in _JSON_WORDS:
            matches |= Q(**{alias: _JSON_WORDS[value]})
        elif VAR_INTEGER.match(value):
            matches |= Q(**{alias: int(value)})
        queryset = queryset.filter(matches)
    return queryset


def _bad(name: str, why: str) -> ApiProblem:
    return ApiProblem(
        "malformed-request",
        f"The query parameter {name!r} cannot be used: {why}.",
        errors=[{"field": name, "detail": why}],
    )


class FilterBackend(DjangoFilterBackend):
    """django-filter, with unreadable values as a 400 naming each parameter."""

    def filter_queryset(self, request, queryset, view):
        filterset = self.get_filterset(request, queryset, view)
        if filterset is None:
            return queryset
        params = request.query_params
        for name, field in filterset.filters.items():
            values = params.getlist(name)
            if "" in values:
                raise _bad(name, "give it a value, or leave it out")
            if len(values) > 1 and not isinstance(field, django_filters.MultipleChoiceFilter):
                raise _bad(name, "give it once")
        if not filterset.is_valid():
            errors = [
                {"field": name, "detail": str(message)}
                for name, messages in filterset.errors.items()
                for message in messages
            ]
            raise ApiProblem(
                "malformed-request",
                "The query cannot be used: "
                + "; ".join(f"{e['field']}: {e['detail']}" for e in errors),
                errors=errors,
            )
        queryset = filterset.qs
        if getattr(view, "case_variable_filters", False):
            queryset = filter_variables(queryset, request.query_params)
        return queryset
