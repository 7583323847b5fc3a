from django.apps import AppConfig


class EventsConfig(AppConfig):
    name = "controlplane.events"
    label = "events"
