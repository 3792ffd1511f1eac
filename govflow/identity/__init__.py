"""Identity and access: second factors, login throttling, privileged sessions (issue 14)."""
