"""GovFlow: a durable workflow engine for public administration."""
