from rest_framework import serializers

from controlplane.catalog.models import Model
from controlplane.deployments.models import CachePolicy, Deployment, Replica


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
            "min_cached_prefix_tokens",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "created_at", "updated_at"]


class ReplicaSerializer(serializers.ModelSerializer):
    deployment = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    node = serializers.SlugRelatedField(slug_field="name", read_only=True)
    devices = serializers.SerializerMethodField()

    class Meta:
        model = Replica
        fields = [
            "id",
            "deployment",
            "role",
            "generation",
            "node",
            "devices",
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


# A deployment's fields that the platform sets and reports (read-only); the rest are the operator's.
DEPLOYMENT_STATE_FIELDS = [
    "desired_state",
    "status",
    "generation",
    "replica_states",
    "placement_error",
    "failed_at",
    "failed_reason",
    "created_at",
    "updated_at",
]


class DeploymentSerializer(serializers.ModelSerializer):
    model = serializers.SlugRelatedField(slug_field="name", queryset=Model.objects.all())
    cache_policy = serializers.SlugRelatedField(
        slug_field="name", queryset=CachePolicy.objects.all(), required=False, allow_null=True
    )
    draft_model = serializers.SlugRelatedField(
        slug_field="name", queryset=Model.objects.all(), required=False, allow_null=True
    )
    replica_states = serializers.SerializerMethodField()
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
            "max_surge",
            *DEPLOYMENT_STATE_FIELDS,
        ]
        read_only_fields = ["id", *DEPLOYMENT_STATE_FIELDS]

    def get_replica_states(self, obj) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in obj.replica_set.all():
            if r.state in Replica.LIVE_STATES:
                counts[r.state] = counts.get(r.state, 0) + 1
        return counts


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
