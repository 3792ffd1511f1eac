from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "govflow.demo"
    label = "govflow_demo"
    verbose_name = "Demo module"
