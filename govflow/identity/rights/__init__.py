"""Rights changes: recorded on a keyed chain, grants confirmed by a second administrator.

- :mod:`.policy` says what counts as a right (read from permissions, not group names);
- :mod:`.trail` appends the facts to the rights trail, the chain ``govflow.rights:trail``;
- :mod:`.signals` records every change made through the ORM, whoever made it;
- :mod:`.services` requests, confirms and rejects grants (four eyes, ADR 0025);
- :mod:`.admin` is the admin's user, group and rights-change pages.
"""
