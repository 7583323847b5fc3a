import redis
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.catalog.models import Model
from controlplane.common import redis as redis_client
from controlplane.deployments.models import CachePolicy, Deployment, Replica
from controlplane.gateway.routing import quality


class CachePolicySerializer(serializers.ModelSerializer):
    class Meta:
        model = CachePolicy
        fields = [
            "id",
            "name",
            "prefix_caching",
            "block_size",
            "session_affinity_header",
            "session_affinity_ttl_seconds",
            "routing",
            "affinity_load_factor",
            "dram_tier_bytes",
            "disk_tier_path",
            "disk_tier_bytes",
            "store_tier",
            "min_cached_prefix_tokens",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "created_at", "updated_at"]


class ReplicaSerializer(serializers.ModelSerializer):
    deployment = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    node = serializers.SlugRelatedField(slug_field="name", read_only=True)
    devices = serializers.SerializerMethodField()
    ranks = serializers.SerializerMethodField(
        help_text="the replica's ranks (tensor_parallel x pipeline_parallel), each with the device it holds"
    )

    class Meta:
        model = Replica
        fields = [
            "id",
            "deployment",
            "role",
            "generation",
            "node",
            "devices",
            "ranks",
            "state",
            "endpoint",
            "pid",
            "last_heartbeat",
            "restart_count",
            "last_error",
            "log_tail",
            "load",
            "progress",
            "drain_requested_at",
            "created_at",
            "started_at",
            "ready_at",
            "stopped_at",
        ]

    def get_devices(self, obj) -> list[str]:
        return [f"{d.kind}:{d.index}" for d in obj.devices.all()]

    @extend_schema_field(
        {
            "type": "array",
            "items": {"type": "object", "properties": {"rank": {"type": "integer"}, "device": {"type": "string"}}},
        }
    )
    def get_ranks(self, obj) -> list[dict]:
        """Rank r runs on the replica's r-th device by index (the spec's device order)."""
        devices = sorted(obj.devices.all(), key=lambda d: d.index)
        return [{"rank": r, "device": f"{d.kind}:{d.index}"} for r, d in enumerate(devices)]


class RoutingQualitySerializer(serializers.Serializer):
    """The gateway's routing-quality sums of one deployment (gateway/routing/quality.py), since counting began."""

    decisions = serializers.IntegerField(help_text="routing decisions made knowing the prompt's token ids")
    best_prefix_decisions = serializers.IntegerField(
        help_text="decisions that chose a replica holding the longest cached prefix of any"
    )
    routed_input_tokens = serializers.IntegerField(help_text="prompt tokens of those decisions")
    reachable_tokens = serializers.IntegerField(
        help_text="prompt tokens cached on the best replica the load bound allowed (what perfect routing reuses)"
    )
    predicted_tokens = serializers.IntegerField(help_text="prompt tokens cached on the replicas chosen")
    input_tokens = serializers.IntegerField(help_text="prompt tokens of requests that finished")
    cached_tokens = serializers.IntegerField(help_text="of those, tokens their replicas served from the prefix cache")
    achieved_hit_rate = serializers.FloatField(allow_null=True, help_text="cached_tokens / input_tokens; null at 0")
    reachable_hit_rate = serializers.FloatField(
        allow_null=True, help_text="reachable_tokens / routed_input_tokens; null at 0"
    )


def routing_quality(sums: dict[str, int]) -> dict:
    """The sums with their hit rates (a rate over nothing is null, not 0)."""
    rate = lambda part, whole: round(part / whole, 4) if whole else None  # noqa: E731
    return {
        **sums,
        "achieved_hit_rate": rate(sums["cached_tokens"], sums["input_tokens"]),
        "reachable_hit_rate": rate(sums["reachable_tokens"], sums["routed_input_tokens"]),
    }


# A deployment's fields that the platform sets and reports (read-only); the rest are the operator's.
DEPLOYMENT_STATE_FIELDS = [
    "desired_state",
    "status",
    "generation",
    "replica_states",
    "routing_quality",
    "placement_error",
    "failed_at",
    "failed_reason",
    "created_at",
    "updated_at",
]


class DeploymentSerializer(serializers.ModelSerializer):
    model = serializers.SlugRelatedField(slug_field="name", queryset=Model.objects.all())
    cache_policy = serializers.SlugRelatedField(
        slug_field="name",
        queryset=CachePolicy.objects.all(),
        required=False,
        allow_null=True,
        help_text="a policy with KV tiers is refused with tensor_parallel or pipeline_parallel > 1 "
        "(docs/operations.md, 'Settings refused together')",
    )
    draft_model = serializers.SlugRelatedField(
        slug_field="name",
        queryset=Model.objects.all(),
        required=False,
        allow_null=True,
        help_text="eagle3 (required) and auto (optional): a registered EAGLE-3 head trained for the model "
        "(null otherwise)",
    )
    replica_states = serializers.SerializerMethodField()
    routing_quality = serializers.SerializerMethodField(
        help_text="null while Redis, where the gateway counts it, cannot be read"
    )
    status = serializers.ChoiceField(
        choices=["running", "stopped", "failed"],
        read_only=True,
        help_text="failed: the reconciler gave up starting replicas (see failed_reason) until start or restart",
    )

    class Meta:
        model = Deployment
        fields = [
            "id",
            "slug",
            "model",
            "mode",
            "replicas",
            "prefill_replicas",
            "decode_replicas",
            "tensor_parallel",
            "pipeline_parallel",
            "dtype",
            "max_model_len",
            "max_num_seqs",
            "cache_policy",
            "speculative_method",
            "draft_model",
            "speculative_k",
            "fair_share",
            "engine",
            "sim_profile",
            "max_surge",
            *DEPLOYMENT_STATE_FIELDS,
        ]
        read_only_fields = ["id", *DEPLOYMENT_STATE_FIELDS]
        extra_kwargs = {
            "speculative_method": {
                "help_text": "speculative decoding: none, ngram (drafts from the prompt and output), eagle3 "
                "(drafts with draft_model) or auto (prompt lookup where the context repeats, draft_model if "
                "given elsewhere, k per step from the replica's measured costs, none where nothing pays); "
                "colocated and decode replicas speculate, prefill replicas never"
            },
            "speculative_k": {"help_text": "tokens drafted per step (1-16); auto's most"},
            "engine": {
                "help_text": "real (the model) or sim: the simulated engine, with the real scheduler and KV cache and "
                "step times from sim_profile, for fleet-size tests (docs/operations.md, 'The simulated engine'); "
                "sim runs colocated replicas of one device, without speculation or KV tiers"
            },
            **{
                size: {
                    "help_text": "ranks per replica (tensor_parallel x pipeline_parallel devices of one node); > 1 "
                    "is refused with KV tiers and with models the engine cannot split so (docs/operations.md, "
                    "'Settings refused together')"
                }
                for size in ("tensor_parallel", "pipeline_parallel")
            },
        }

    def get_replica_states(self, obj) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in obj.replica_set.all():
            if r.state in Replica.LIVE_STATES:
                counts[r.state] = counts.get(r.state, 0) + 1
        return counts

    @extend_schema_field(RoutingQualitySerializer(allow_null=True))
    def get_routing_quality(self, obj) -> dict | None:
        if self.context.get("redis_unreachable"):  # a list waits out Redis' timeout once, not per row
            return None
        try:
            return routing_quality(quality.read(redis_client.client(), obj.slug))
        except redis.RedisError:  # the deployment is still worth showing
            self.context["redis_unreachable"] = True
            return None


class ScaleSerializer(serializers.Serializer):
    replicas = serializers.IntegerField(min_value=0, max_value=64, required=False)
    prefill_replicas = serializers.IntegerField(min_value=0, max_value=64, required=False)
    decode_replicas = serializers.IntegerField(min_value=0, max_value=64, required=False)

    def validate(self, attrs):
        if not attrs:
            raise serializers.ValidationError("give replicas, prefill_replicas or decode_replicas")
        return attrs


class DrainSerializer(serializers.Serializer):
    replica = serializers.IntegerField(required=False, help_text="one replica id; all replicas when omitted")
