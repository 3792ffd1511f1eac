"""Realistic variables for a demo building-permit application (fictitious people)."""

from __future__ import annotations

import random
from typing import Any

APPLICANTS = [
    (
        "Maria Jansen",
        "m.jansen@example.org",
        "ASD-K-4821",
        "Keizersgracht 112, Amsterdam",
        "Single-storey rear extension with a flat green roof",
        18,
    ),
    (
        "Tomasz Nowak",
        "t.nowak@example.org",
        "UTR-C-1907",
        "Oudegracht 45, Utrecht",
        "Dormer window on the street side of the attic",
        6,
    ),
    (
        "Aisha Bakker",
        "a.bakker@example.org",
        "RTD-H-3310",
        "Hoflaan 7, Rotterdam",
        "Detached garden studio on a concrete slab",
        24,
    ),
]
FEE_PER_M2_CENTS = 1850
BASE_FEE_CENTS = 9500


def sample_variables(
    *, applicant: str | None = None, parcel: str | None = None, rng: random.Random | None = None
) -> dict[str, Any]:
    """Variables for ``demo.building_permit``; ``applicant``/``parcel`` override the pick."""
    name, email, parcel_id, address, project, area = (rng or random).choice(APPLICANTS)
    if applicant:
        name = applicant
        email = applicant.lower().replace(" ", ".") + "@example.org"
    return {
        "applicant": {"name": name, "email": email},
        "parcel": {"id": parcel or parcel_id, "address": address},
        "project": {"description": project, "floor_area_m2": area},
        "fee": {"amount_cents": BASE_FEE_CENTS + FEE_PER_M2_CENTS * area, "currency": "EUR"},
    }
