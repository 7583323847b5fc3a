from controlplane.events.models import Event


def event_list():
    return Event.objects.select_related("actor")
