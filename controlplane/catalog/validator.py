"""The validator: a registered local model is checked in full (its directory again, under
MODEL_ROOTS, and the checksum of its weights) by the `catalog.validate_model` task. Below both
services.py (which enqueues the task after registering) and tasks.py (which runs this)."""

from django.conf import settings

from controlplane.catalog import validation
from controlplane.catalog.models import Model
from controlplane.events.services import record_event


def apply_info(model: Model, info: validation.ModelInfo) -> None:
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
        apply_info(model, info)
        model.checksum = validation.checksum(info.weight_files)
        model.status, model.status_message = Model.Status.READY, ""
    except (validation.ModelDirectoryError, OSError) as exc:
        model.status, model.status_message = Model.Status.ERROR, str(exc)
    model.save()
    record_event(f"model.{model.status}", model, actor_label="validator", data={"message": model.status_message})
    return model
