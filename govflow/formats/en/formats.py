"""English: ISO-style date-times to the second (``2026-12-01 20:05:09 UTC``)."""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s"
