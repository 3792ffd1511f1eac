"""The desk's date and number formats per language (``FORMAT_MODULE_PATH``).

Django's own formats are kept, except that a date-time shows the seconds and the time
zone: timers run in seconds and polls a few seconds apart, so minutes are not enough.
"""
