from django.conf import settings
from django.db import transaction

from controlplane.catalog import validation
from controlplane.catalog.models import Model
from controlplane.common.errors import DomainError
from controlplane.events.services import record_event


@transaction.atomic
def register_model(*, name: str, source: str, source_type: str = Model.Source.LOCAL, actor=None) -> Model:
    """Register a model. A local directory must be under MODEL_ROOTS and is checked now (400
    with the reason when broken); the checksum is computed by the `catalog.validate_model` task."""
    if Model.objects.filter(name=name).exists():
        raise DomainError(f"a model named {name!r} already exists", field="name")
    model = Model(name=name, source=source, source_type=source_type)
    if source_type == Model.Source.LOCAL:
        try:
            info = validation.inspect_directory(validation.check_under_roots(source, settings.MODEL_ROOTS))
        except validation.ModelDirectoryError as exc:
            raise DomainError(str(exc), field="source") from exc
        _apply_info(model, info)
    else:
        model.status_message = "hub model recorded; weights are downloaded by the node that first serves it"
    model.save()
    record_event("model.registered", model, actor=actor, data={"source": source})
    if source_type == Model.Source.LOCAL:
        from controlplane.catalog.tasks import validate_model_task

        transaction.on_commit(lambda: validate_model_task.delay(model.pk))
    return model


def _apply_info(model: Model, info: validation.ModelInfo) -> None:
    model.architecture = info.architecture
    model.parameter_count = info.parameter_count
    model.dtype = info.dtype
    model.bytes_on_disk = info.bytes_on_disk
    model.context_length = info.context_length


def validate_model(model_id: int) -> Model | None:
    """registered → validating → ready | error. Idempotent: a ready model is left alone."""
    model = Model.objects.filter(pk=model_id).first()
    if model is None or model.source_type != Model.Source.LOCAL or model.status == Model.Status.READY:
        return model
    Model.objects.filter(pk=model.pk).update(status=Model.Status.VALIDATING)
    try:
        # The roots again: the directory may have been swapped for a symlink since registration.
        info = validation.inspect_directory(validation.check_under_roots(model.source, settings.MODEL_ROOTS))
        _apply_info(model, info)
        model.checksum = validation.checksum(info.weight_files)
        model.status, model.status_message = Model.Status.READY, ""
    except (validation.ModelDirectoryError, OSError) as exc:
        model.status, model.status_message = Model.Status.ERROR, str(exc)
    model.save()
    record_event(f"model.{model.status}", model, actor_label="validator", data={"message": model.status_message})
    return model


def delete_model(model: Model, actor=None) -> None:
    if model.deployments.exists():
        raise DomainError(
            f"model {model.name!r} is used by deployments: "
            f"{', '.join(model.deployments.values_list('slug', flat=True))}"
        )
    record_event("model.deleted", model, actor=actor)
    model.delete()
