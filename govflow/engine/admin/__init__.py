"""The engine's own admin: definitions (with their upload page) and its working records.

The operator's pages of instances — the instance page, its decisions, approvals and
migrations — are the handoffs app's (``govflow.handoffs.admin``).

Pages are thin: parse the request, check the permission, call one service, render. State
changes have their own POST views (``get_urls``), never ``save_model``: the admin's change
view runs inside a transaction, and the services own theirs.
"""

from . import definitions, records  # noqa: F401  (registers the model admins)
