"""The operator's pages of instances: the list, one instance's page, and its POST actions.

Pages are thin: parse the request, check the permission, call one service, render. State
changes have their own POST views (``get_urls``), never ``save_model``: the admin's change
view runs inside a transaction, and the services own theirs. The model is the engine's
``Instance``, so the URL names stay ``admin:engine_instance_*`` and the templates
``admin/engine/instance/*.html`` (shipped in this app's ``templates/``).
"""

from . import batches, instances, webhooks  # noqa: F401  (registers the model admins)
