"""The operators' admin for the engine: definitions, instances and their records.

Pages are thin: parse the request, check the permission, call one service, render. State
changes have their own POST views (``get_urls``), never ``save_model``: the admin's change
view runs inside a transaction, and the services own theirs.
"""

from . import definitions, instances, records  # noqa: F401  (registers the model admins)
