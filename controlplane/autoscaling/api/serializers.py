from rest_framework import serializers

from controlplane.autoscaling.models import Autoscaling


class AutoscalingSerializer(serializers.ModelSerializer):
    deployment = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    # null until the settings are first saved (GET shows the defaults of a deployment never configured)
    updated_at = serializers.DateTimeField(read_only=True, allow_null=True)

    class Meta:
        model = Autoscaling
        fields = ["deployment", "enabled", "mode", "min_replicas", "max_replicas", "ttft_p90_ms", "itl_p90_ms",
                  "scale_down_cooldown_seconds", "tolerance", "capacity_profile", "recommendation", "last_change_at",
                  "updated_at"]  # fmt: skip
        read_only_fields = ["deployment", "recommendation", "last_change_at", "updated_at"]
        extra_kwargs = {
            "mode": {"help_text": "advisory: decide and show, change nothing; active: scale the deployment"},
            "recommendation": {
                "help_text": "the last interval: the decision (replicas, action, rule, reason), the "
                "demand measured and the capacity per replica it was judged against"
            },
        }
