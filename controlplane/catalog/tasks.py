from celery import shared_task

from controlplane.catalog.validator import validate_model


@shared_task(name="catalog.validate_model", queue="control")
def validate_model_task(model_id: int) -> str | None:
    model = validate_model(model_id)
    return model.status if model else None
