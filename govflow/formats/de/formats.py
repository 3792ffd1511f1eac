"""German: day first, to the second (``01.12.2026, 20:05:09 UTC``)."""

DATETIME_FORMAT = "d.m.Y, H:i:s T"
SHORT_DATETIME_FORMAT = "d.m.Y H:i:s"
