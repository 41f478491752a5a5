from django.db import models


class Order(models.Model):
    reference = models.CharField(max_length=40)

    def __str__(self) -> str:
        return self.reference
