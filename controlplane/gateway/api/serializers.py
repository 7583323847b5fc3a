from rest_framework import serializers

from controlplane.deployments.models import Deployment
from controlplane.gateway.models import ApiKey


class ApiKeySerializer(serializers.ModelSerializer):
    owner = serializers.SlugRelatedField(slug_field="username", read_only=True)
    allowed_deployments = serializers.SlugRelatedField(
        slug_field="slug", many=True, required=False, queryset=Deployment.objects.all()
    )

    class Meta:
        model = ApiKey
        fields = [
            "id",
            "name",
            "prefix",
            "owner",
            "allowed_deployments",
            "rpm_limit",
            "tpm_limit",
            "weight",
            "min_priority",
            "revoked",
            "revoked_at",
            "last_used_at",
            "created_at",
        ]
        read_only_fields = ["id", "prefix", "owner", "revoked", "revoked_at", "last_used_at", "created_at"]


class ApiKeyCreatedSerializer(ApiKeySerializer):
    secret = serializers.CharField(read_only=True, help_text="shown once; store it now")

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "secret"]
