"""The state tables as the docs write them, kept apart from the code's tables.

``docs/recovery.md`` (ledger operations) and ``docs/architecture.md`` ("Step states",
tokens); the tests compare the code's tables with these, pair by pair.
"""

OPERATION_MOVES = {
    ("prepared", "dispatched"),
    ("prepared", "failed"),
    ("dispatched", "succeeded"),
    ("dispatched", "failed"),
    ("dispatched", "pending"),
    ("dispatched", "outcome_unknown"),
    ("outcome_unknown", "effect_confirmed"),
    ("outcome_unknown", "effect_absent"),
}
OPERATION_STATES = [
    "prepared",
    "dispatched",
    "succeeded",
    "failed",
    "pending",
    "outcome_unknown",
    "effect_confirmed",
    "effect_absent",
]

TOKEN_MOVES = {
    ("ready", "executing"),
    ("ready", "completed"),
    ("ready", "failed"),
    ("ready", "cancelled"),
    ("executing", "ready"),
    ("executing", "completed"),
    ("executing", "failed"),
    ("executing", "outcome_unknown"),
    ("executing", "cancelled"),
    ("waiting", "ready"),
    ("waiting", "completed"),
    ("waiting", "cancelled"),
    ("waiting", "failed"),
    ("outcome_unknown", "completed"),
    ("outcome_unknown", "failed"),
    ("outcome_unknown", "cancelled"),
    ("failed", "ready"),
    ("failed", "waiting"),
}
TOKEN_STATES = [
    "ready",
    "executing",
    "waiting",
    "outcome_unknown",
    "completed",
    "failed",
    "cancelled",
]
