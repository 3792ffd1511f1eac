"""GovFlow's REST API for integrations: ``/api/v1/`` (see ``docs/integrations.md``)."""
