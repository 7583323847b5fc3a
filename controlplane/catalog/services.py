from django.apps import apps
from django.conf import settings
from django.db import transaction

from controlplane.catalog import validation
from controlplane.catalog.models import Model
from controlplane.catalog.tasks import validate_model_task
from controlplane.catalog.validator import apply_info
from controlplane.catalog.validator import validate_model as validate_model  # the validator's work, run now
from controlplane.common.errors import DomainError
from controlplane.events.services import record_event
from workers.protocol.draft_models import draft_fit_problems, read_eagle3
from workers.protocol.model_files import read_config


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
        apply_info(model, info)
    else:
        model.status_message = "hub model recorded; weights are downloaded by the node that first serves it"
    model.save()
    record_event("model.registered", model, actor=actor, data={"source": source})
    if source_type == Model.Source.LOCAL:
        transaction.on_commit(lambda: validate_model_task.delay(model.pk))
    return model


def check_draft(draft: Model, target: Model) -> None:
    """That `draft` is an EAGLE-3 head that can draft for `target` (vocabulary, hidden size, aux
    layer ids); DomainError on `draft_model` naming what does not fit. Both directories are read
    now (headers and configs only), under MODEL_ROOTS as at registration."""
    if draft.source_type != Model.Source.LOCAL or target.source_type != Model.Source.LOCAL:
        hub = draft if draft.source_type != Model.Source.LOCAL else target
        raise DomainError(
            f"model {hub.name!r} is a hub id: an EAGLE-3 draft is checked against its target's files, "
            "so both must be registered local directories",
            "draft_model",
        )
    if not draft.is_draft:
        raise DomainError(
            f"model {draft.name!r} is not an EAGLE-3 draft head (architecture {draft.architecture or 'unknown'!r}); "
            "register the head's directory (architecture LlamaForCausalLMEagle3 or Eagle3LlamaForCausalLM)",
            "draft_model",
        )
    for m in (draft, target):
        if m.status == Model.Status.ERROR:
            raise DomainError(f"model {m.name!r} failed validation: {m.status_message}", "draft_model")
    try:
        spec = read_eagle3(validation.check_under_roots(draft.source, settings.MODEL_ROOTS))
        target_config = read_config(validation.check_under_roots(target.source, settings.MODEL_ROOTS))
    except (validation.ModelDirectoryError, OSError) as exc:
        raise DomainError(
            f"draft {draft.name!r} cannot be checked against {target.name!r}: {exc}", "draft_model"
        ) from exc
    problems = draft_fit_problems(spec, target_config)
    if problems:
        raise DomainError(
            f"draft {draft.name!r} does not fit model {target.name!r}: {'; '.join(problems)}", "draft_model"
        )


def delete_model(model: Model, actor=None) -> None:
    if model.deployments.exists():
        raise DomainError(
            f"model {model.name!r} is used by deployments: "
            f"{', '.join(model.deployments.values_list('slug', flat=True))}"
        )
    # The draft_model relation has no reverse accessor; looked up by name, since the deployments
    # app imports the catalog and not the other way round.
    deployment = apps.get_model("deployments", "Deployment")
    drafting = list(deployment.objects.filter(draft_model=model).values_list("slug", flat=True))
    if drafting:
        raise DomainError(f"model {model.name!r} is the draft_model of deployments: {', '.join(drafting)}")
    record_event("model.deleted", model, actor=actor)
    model.delete()
