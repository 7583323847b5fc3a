"""A deployment's speculative decoding through the management API: none, ngram, eagle3 and auto
with their k; an EAGLE-3 head registers as a draft, is refused as a deployment's own model, and is
checked against the deployment's model (vocabulary, hidden size, aux layers) with a 400 naming
what does not fit; the replica spec carries the settings (prefill replicas never speculate)."""

import pytest

from controlplane.catalog.services import register_model
from controlplane.deployments.models import Deployment, Replica
from controlplane.deployments.replica_specs import build_spec
from tests.engine.checkpoints import build_checkpoint, build_eagle3_head
from workers.protocol.control import spec_from_wire

pytestmark = pytest.mark.django_db


@pytest.fixture
def target(model_dir):
    """The deployments' model: a tiny random Llama (2 layers, vocabulary 320, hidden size 64)."""
    return register_model(name="tiny", source=str(model_dir))


@pytest.fixture(scope="module")
def heads(tmp_path_factory, model_dir):
    """EAGLE-3 heads by what they were built for: the target itself, or something else."""
    root = tmp_path_factory.mktemp("heads")
    other_vocab = build_checkpoint(root / "vocab-400", "llama", vocab_size=400)
    other_hidden = build_checkpoint(root / "hidden-96", "llama", hidden_size=96)
    return {
        "fits": build_eagle3_head(root / "fits", model_dir, draft_vocab_size=200),
        "vocab": build_eagle3_head(root / "vocab", other_vocab),
        "hidden": build_eagle3_head(root / "hidden", other_hidden),
        "layers": build_eagle3_head(root / "layers", model_dir, aux_layer_ids=[0, 1, 7]),
    }


def register_head(staff_client, name: str, path) -> dict:
    response = staff_client.post("/api/v1/models/", {"name": name, "source": str(path)}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def create(staff_client, **fields):
    return staff_client.post("/api/v1/deployments/", {"slug": "d", "model": "tiny", **fields}, format="json")


def test_an_eagle3_head_registers_as_a_draft(staff_client, heads):
    body = register_head(staff_client, "head", heads["fits"])
    assert (body["architecture"], body["is_draft"]) == ("LlamaForCausalLMEagle3", True)
    assert body["parameter_count"] > 0
    from controlplane.catalog.services import validate_model

    assert validate_model(body["id"]).status == "ready"  # the checksum task accepts it too


def test_a_draft_head_is_not_deployed_as_a_model(staff_client, heads):
    register_head(staff_client, "head", heads["fits"])
    response = staff_client.post("/api/v1/deployments/", {"slug": "d", "model": "head"}, format="json")
    assert response.status_code == 400
    assert "is an EAGLE-3 draft head" in response.json()["model"][0]
    assert not Deployment.objects.exists()


def test_ngram_is_accepted_with_its_k(staff_client, target):
    response = create(staff_client, speculative_method="ngram", speculative_k=3)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["speculative_method"], body["speculative_k"], body["draft_model"]) == ("ngram", 3, None)


@pytest.mark.parametrize("method", ["ngram", "none"])
def test_a_draft_model_without_eagle3_is_refused(staff_client, target, heads, method):
    register_head(staff_client, "head", heads["fits"])
    response = create(staff_client, speculative_method=method, draft_model="head")
    assert response.status_code == 400
    assert "draft_model is only used by speculative_method 'eagle3' or 'auto'" in response.json()["draft_model"][0]


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("speculative_k", 0, "greater than or equal to 1"),
        ("speculative_k", 17, "less than or equal to 16"),
        ("speculative_method", "medusa", "not a valid choice"),
        ("draft_model", "no-such-model", "does not exist"),
    ],
)
def test_values_outside_the_range_are_refused_naming_the_field(staff_client, target, field, value, says):
    response = create(staff_client, **{"speculative_method": "ngram", field: value})
    assert response.status_code == 400
    assert says in response.json()[field][0]


def test_eagle3_needs_a_draft_model(staff_client, target):
    response = create(staff_client, speculative_method="eagle3", speculative_k=3)
    assert response.status_code == 400
    assert "speculative_method 'eagle3' needs a draft_model" in response.json()["draft_model"][0]


def test_eagle3_with_a_head_that_fits_is_accepted(staff_client, target, heads):
    register_head(staff_client, "head", heads["fits"])
    response = create(staff_client, speculative_method="eagle3", speculative_k=5, draft_model="head")
    assert response.status_code == 201, response.json()
    dep = Deployment.objects.get()
    assert (dep.speculative_method, dep.speculative_k, dep.draft_model.name) == ("eagle3", 5, "head")


def test_auto_takes_a_head_or_none_and_reaches_the_replica(staff_client, target, heads):
    """auto: prompt lookup where the context repeats, the head (if given) elsewhere, k chosen per
    step by the replica's measured costs; the head is checked against the model as for eagle3."""
    register_head(staff_client, "head", heads["fits"])
    register_head(staff_client, "bad-head", heads["vocab"])
    bare = create(staff_client, speculative_method="auto", speculative_k=4)
    assert bare.status_code == 201, bare.json()
    spec = build_spec(Replica.objects.create(deployment=Deployment.objects.get()))
    assert spec.speculative.engine_config() == {"method": "auto", "num_speculative_tokens": 4}
    url = "/api/v1/deployments/d/"
    bad = staff_client.patch(url, {"draft_model": "bad-head"}, format="json")
    assert bad.status_code == 400 and "does not fit" in bad.json()["draft_model"][0]
    with_head = staff_client.patch(url, {"draft_model": "head"}, format="json")
    assert with_head.status_code == 200, with_head.json()
    spec = build_spec(Replica.objects.create(deployment=Deployment.objects.get()))
    config = spec_from_wire(spec.to_wire()).speculative.engine_config()
    assert (config["method"], config["model"]) == ("auto", str(heads["fits"]))


def test_eagle3_runs_on_a_parallel_replica(staff_client, target, heads):
    """Over pipeline stages too: rank 0's head reads every stage's layers (docs/parallelism.md)."""
    register_head(staff_client, "head", heads["fits"])
    response = create(staff_client, speculative_method="eagle3", draft_model="head", pipeline_parallel=2)
    assert response.status_code == 201, response.json()
    spec = build_spec(Replica.objects.create(deployment=Deployment.objects.get()))
    assert (spec.pipeline_parallel, spec.speculative.method) == (2, "eagle3")


@pytest.mark.parametrize(
    ("head", "says"),
    [
        ("vocab", "the draft's vocab_size is 400, the target's 320"),
        ("hidden", "the draft fuses hidden states of size 96, the target's are 64"),
        ("layers", "aux hidden state layers [7] are not layers of the target (it has 2)"),
    ],
)
def test_a_head_that_does_not_fit_the_model_is_refused_saying_why(staff_client, target, heads, head, says):
    register_head(staff_client, "head", heads[head])
    response = create(staff_client, speculative_method="eagle3", draft_model="head")
    assert response.status_code == 400
    message = response.json()["draft_model"][0]
    assert message.startswith("draft 'head' does not fit model 'tiny': ") and says in message
    assert not Deployment.objects.exists()


def test_a_model_that_is_no_head_is_refused_as_a_draft(staff_client, target):
    response = create(staff_client, speculative_method="eagle3", draft_model="tiny")
    assert response.status_code == 400
    assert "model 'tiny' is not an EAGLE-3 draft head" in response.json()["draft_model"][0]


def test_a_hub_model_cannot_be_checked_for_eagle3(staff_client, target, heads):
    register_head(staff_client, "head", heads["fits"])
    register_model(name="hub", source="org/hub", source_type="hub")
    response = staff_client.post(
        "/api/v1/deployments/",
        {"slug": "d", "model": "hub", "speculative_method": "eagle3", "draft_model": "head"},
        format="json",
    )
    assert response.status_code == 400
    assert "model 'hub' is a hub id" in response.json()["draft_model"][0]


def test_changing_speculation_is_checked_and_reaches_replicas_started_from_then(staff_client, target, heads):
    register_head(staff_client, "head", heads["fits"])
    register_head(staff_client, "bad-head", heads["vocab"])
    assert create(staff_client).status_code == 201
    url = "/api/v1/deployments/d/"
    to_eagle = staff_client.patch(url, {"speculative_method": "eagle3", "draft_model": "head"}, format="json")
    assert to_eagle.status_code == 200, to_eagle.json()
    assert to_eagle.json()["generation"] == 1  # like other engine settings: a restart rolls replicas onto it
    bad = staff_client.patch(url, {"draft_model": "bad-head"}, format="json")
    assert bad.status_code == 400 and "does not fit" in bad.json()["draft_model"][0]
    # Leaving eagle3 means saying the draft goes too: nothing stored is left unused in silence.
    kept = staff_client.patch(url, {"speculative_method": "ngram"}, format="json")
    assert kept.status_code == 400
    assert "only used by speculative_method 'eagle3' or 'auto'" in kept.json()["draft_model"][0]
    to_ngram = staff_client.patch(url, {"speculative_method": "ngram", "draft_model": None}, format="json")
    assert to_ngram.status_code == 200, to_ngram.json()
    dep = Deployment.objects.get()
    assert (dep.speculative_method, dep.draft_model) == ("ngram", None)


def test_a_draft_in_use_is_not_deleted(staff_client, target, heads):
    head = register_head(staff_client, "head", heads["fits"])
    assert create(staff_client, speculative_method="eagle3", draft_model="head").status_code == 201
    response = staff_client.delete(f"/api/v1/models/{head['id']}/")
    assert response.status_code == 400
    assert "model 'head' is the draft_model of deployments: d" in response.json()["detail"]


def test_the_replica_spec_carries_speculation_to_colocated_and_decode_replicas_only(target, heads):
    from controlplane.catalog.models import Model
    from controlplane.deployments.services import create_deployment

    head = register_model(name="head", source=str(heads["fits"]))
    ngram = create_deployment({"slug": "ngram", "model": target, "speculative_method": "ngram", "speculative_k": 3})
    eagle = create_deployment({"slug": "pd", "model": target, "mode": "disaggregated", "prefill_replicas": 1,
                               "decode_replicas": 1, "speculative_method": "eagle3", "speculative_k": 2,
                               "draft_model": head})  # fmt: skip
    plain = create_deployment({"slug": "plain", "model": target})

    def spec(dep, role=Replica.Role.COLOCATED):
        wire = build_spec(Replica.objects.create(deployment=dep, role=role)).to_wire()
        return spec_from_wire(wire)  # as the node agent reads it

    assert spec(ngram).speculative.engine_config() == {"method": "ngram", "num_speculative_tokens": 3}
    assert spec(eagle, Replica.Role.DECODE).speculative.engine_config() == {
        "method": "eagle3",
        "num_speculative_tokens": 2,
        "model": Model.objects.get(name="head").source,
    }
    assert spec(eagle, Replica.Role.PREFILL).speculative is None
    assert spec(plain).speculative is None
