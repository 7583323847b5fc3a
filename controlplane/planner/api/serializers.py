import math

from rest_framework import serializers

from controlplane.planner import capacity


class PlanRequestSerializer(serializers.Serializer):
    model = serializers.CharField(
        required=False, max_length=100, help_text="a registered model's name (or id): its config.json is read"
    )
    config = serializers.JSONField(required=False, help_text="a config.json object, instead of model")
    quantization = serializers.ChoiceField(
        choices=capacity.QUANTIZATIONS,
        required=False,
        help_text="weights' quantization; default: what the config's quantization_config says (fp8 for "
        "quant_method fp8, int4-experts for compressed-tensors pack-quantized int4), else none",
    )
    dtype = serializers.ChoiceField(
        choices=["auto", "bfloat16", "float16", "float32"],
        default="auto",
        help_text="unquantized weights and KV cache; auto: the config's torch_dtype (as the engine on CUDA)",
    )
    kv_cache_dtype = serializers.ChoiceField(
        choices=capacity.KV_CACHE_DTYPES, default="auto", help_text="auto: dtype; fp8: one byte per value"
    )
    tensor_parallel = serializers.IntegerField(min_value=1, max_value=4096, default=1)
    pipeline_parallel = serializers.IntegerField(min_value=1, max_value=4096, default=1)
    device_memory_bytes = serializers.IntegerField(
        min_value=1,
        max_value=1 << 50,
        required=False,
        allow_null=True,
        help_text="memory of each device; default: the largest CUDA devices in the inventory",
    )
    memory_fraction = serializers.FloatField(
        min_value=0.01,
        max_value=1.0,
        default=capacity.ENGINE_MEMORY_FRACTION,
        help_text="share of each device the replica may use (the engine's gpu_memory_utilization, 0.85)",
    )
    context_tokens = serializers.IntegerField(
        min_value=1,
        max_value=1 << 31,
        required=False,
        allow_null=True,
        help_text="tokens per sequence for max_batch_at_context; default: the model's context length",
    )

    def validate_memory_fraction(self, value: float) -> float:
        if not math.isfinite(value):
            raise serializers.ValidationError("must be a number between 0.01 and 1")
        return value

    def validate(self, attrs):
        if ("model" in attrs) == ("config" in attrs):
            raise serializers.ValidationError("give either model (a registered model's name) or config (a config.json)")
        return attrs


class GroupsSerializer(serializers.Serializer):
    """One figure per part of the model (0 where it has none)."""

    embeddings = serializers.IntegerField()
    attention = serializers.IntegerField(help_text="projections (MLA: q_a/q_b or q_proj, kv_a, kv_b, o) and biases")
    dense_mlp = serializers.IntegerField()
    shared_experts = serializers.IntegerField()
    routed_experts = serializers.IntegerField()
    router = serializers.IntegerField(help_text="gates and their correction biases")
    norms = serializers.IntegerField()
    lm_head = serializers.IntegerField(help_text="0 when tied to the embeddings")
    vision = serializers.IntegerField(help_text="a vision tower and projector the config describes")


class StageSerializer(serializers.Serializer):
    stage = serializers.IntegerField()
    first_layer = serializers.IntegerField()
    last_layer = serializers.IntegerField()
    weight_bytes_per_device = serializers.IntegerField()
    kv_bytes_per_token_per_device = serializers.IntegerField()
    free_bytes_per_device = serializers.IntegerField(allow_null=True)
    max_kv_tokens = serializers.IntegerField(allow_null=True)


class AttentionDataParallelSerializer(serializers.Serializer):
    max_kv_tokens = serializers.IntegerField(
        allow_null=True, help_text="tensor_parallel x max_kv_tokens: each rank caches its own sequences' latent"
    )
    max_batch_at_context = serializers.IntegerField(allow_null=True)
    weight_bytes_per_device_replicated_attention = serializers.IntegerField(
        help_text="weights per device when each rank also holds all the attention weights"
    )
    free_bytes_per_device_replicated_attention = serializers.IntegerField(allow_null=True)
    max_kv_tokens_replicated_attention = serializers.IntegerField(allow_null=True)


class PlanSerializer(serializers.Serializer):
    model = serializers.CharField(allow_null=True, help_text="the registered model planned, if one was named")
    architecture = serializers.CharField()
    text_architecture = serializers.CharField(help_text="the decoder's (a multimodal config nests it)")
    attention = serializers.ChoiceField(choices=["mla", "gqa", "mha"])
    quantization = serializers.ChoiceField(choices=capacity.QUANTIZATIONS)
    quantization_source = serializers.ChoiceField(choices=["config", "request", "default"])
    dtype = serializers.CharField()
    kv_cache_dtype = serializers.CharField()
    tensor_parallel = serializers.IntegerField()
    pipeline_parallel = serializers.IntegerField()
    device_memory_bytes = serializers.IntegerField(allow_null=True)
    device_memory_source = serializers.CharField()
    memory_fraction = serializers.FloatField()
    context_tokens = serializers.IntegerField()
    params_total = serializers.IntegerField()
    params_active = serializers.IntegerField(help_text="per token: all but the routed experts not selected")
    params = GroupsSerializer()
    weight_bytes_total = serializers.IntegerField()
    weight_bytes = GroupsSerializer()
    weight_bytes_per_device = serializers.IntegerField(help_text="the most any one device holds")
    kv_bytes_per_token = serializers.IntegerField(help_text="KV cache per token, whole model")
    kv_bytes_per_token_per_device = serializers.IntegerField()
    usable_bytes_per_device = serializers.IntegerField(allow_null=True, help_text="device memory x memory_fraction")
    free_bytes_per_device = serializers.IntegerField(allow_null=True, help_text="usable - weights; negative: no fit")
    fits = serializers.BooleanField(allow_null=True)
    max_kv_tokens = serializers.IntegerField(allow_null=True, help_text="tokens the replica's KV cache holds")
    max_batch_at_context = serializers.IntegerField(allow_null=True)
    stages = StageSerializer(many=True)
    attention_data_parallel = AttentionDataParallelSerializer(
        allow_null=True, help_text="MLA with tensor_parallel > 1: the attention data-parallel alternative"
    )
    notes = serializers.ListField(child=serializers.CharField(), help_text="how each figure was derived")
