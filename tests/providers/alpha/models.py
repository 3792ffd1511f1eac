from django.db import models


class Note(models.Model):
    """Written by the atomic test action inside the engine's transaction."""

    instance_id = models.BigIntegerField()
    text = models.CharField(max_length=200)

    class Meta:
        app_label = "alpha"

    def __str__(self) -> str:
        return self.text
