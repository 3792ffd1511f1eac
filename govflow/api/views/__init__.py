"""The API's views, one module per resource. Each is thin: parse, check, call, render."""
