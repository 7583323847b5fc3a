from controlplane.catalog.models import Model


def model_list():
    return Model.objects.all()
