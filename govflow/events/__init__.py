"""The event outbox: engine events, webhook subscriptions, the publisher (ADR 0032).

The engine writes an event row in the commit of each transition an integration may
subscribe to (:func:`govflow.events.record.event_record`); the publisher, a thread of every
``qcluster``'s main process fenced like the sweeper, delivers them to webhook
subscriptions, signed, at least once and in order per instance. This app sits *below* the
engine: it imports nothing of ``govflow`` but ``recovery.api``, so the engine may call it.
"""
