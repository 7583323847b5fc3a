from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from controlplane.catalog.models import Model
from controlplane.deployments import routing_policies as policies
from controlplane.inventory.models import Device, Node


class CachePolicy(models.Model):
    """How a deployment caches prompts: engine prefix cache, routing affinity, KV tiers."""

    name = models.SlugField(max_length=100, unique=True)
    prefix_caching = models.BooleanField(default=True)
    block_size = models.PositiveSmallIntegerField(default=16, validators=[MinValueValidator(1), MaxValueValidator(256)])
    session_affinity_header = models.CharField(max_length=100, default="x-session-affinity")
    session_affinity_ttl_seconds = models.PositiveIntegerField(default=600)
    routing = models.CharField(
        max_length=20,
        choices=[(name, name) for name in policies.POLICIES],
        default=policies.DEFAULT_POLICY,
        help_text="how the gateway picks a replica (docs/caching.md)",
    )
    affinity_load_factor = models.FloatField(
        default=policies.DEFAULT_LOAD_FACTOR,
        validators=[MinValueValidator(1.0), MaxValueValidator(10.0)],
        help_text="c of consistent hashing with bounded loads: a replica takes requests while load < ceil(c * mean)",
    )
    # KV tiers behind each replica's device cache (docs/caching.md); all off by default.
    dram_tier_bytes = models.BigIntegerField(
        default=0,
        validators=[MinValueValidator(0)],
        help_text="host memory each replica keeps evicted KV blocks in (0: no DRAM tier)",
    )
    disk_tier_path = models.CharField(
        max_length=500,
        blank=True,
        help_text="absolute directory on every node for the disk tier (empty: no disk tier)",
    )
    disk_tier_bytes = models.BigIntegerField(
        default=0, validators=[MinValueValidator(0)], help_text="the disk tier's byte budget (0: no disk tier)"
    )
    store_tier = models.BooleanField(
        default=False,
        help_text="share KV blocks through the fleet's Mooncake Store (needs SWITCHYARD_KV_STORE_MASTER)",
    )
    min_cached_prefix_tokens = models.PositiveIntegerField(
        default=0, help_text="the shortest prefix worth loading from the store or disk (shorter: recomputed)"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "cache policies"

    def __str__(self) -> str:
        return self.name


class Deployment(models.Model):
    class Mode(models.TextChoices):
        COLOCATED = "colocated"
        DISAGGREGATED = "disaggregated"

    class Speculative(models.TextChoices):
        NONE = "none"
        NGRAM = "ngram"
        EAGLE3 = "eagle3"
        # Prompt lookup where the context repeats, the draft head (if any) elsewhere, k per step
        # from the replica's measured costs (workers/engine/speculative/auto.py).
        AUTO = "auto"

    class DesiredState(models.TextChoices):
        RUNNING = "running"
        STOPPED = "stopped"

    class Engine(models.TextChoices):
        REAL = "real"
        # The simulated engine (workers/sim): the replica protocol, scheduling and KV cache of
        # the real one, step times from a profile, no weights computed (fleet-size tests).
        SIM = "sim"

    slug = models.SlugField(max_length=100, unique=True)
    model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="deployments")
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.COLOCATED)
    replicas = models.PositiveSmallIntegerField(default=1, help_text="colocated replicas")
    prefill_replicas = models.PositiveSmallIntegerField(default=0)
    decode_replicas = models.PositiveSmallIntegerField(default=0)
    tensor_parallel = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)])
    pipeline_parallel = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)])
    dtype = models.CharField(max_length=16, default="auto")
    max_model_len = models.PositiveIntegerField(null=True, blank=True)
    max_num_seqs = models.PositiveIntegerField(default=64, validators=[MinValueValidator(1)])
    cache_policy = models.ForeignKey(
        CachePolicy, null=True, blank=True, on_delete=models.SET_NULL, related_name="deployments"
    )
    speculative_method = models.CharField(max_length=8, choices=Speculative.choices, default=Speculative.NONE)
    draft_model = models.ForeignKey(Model, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    speculative_k = models.PositiveSmallIntegerField(
        default=4, validators=[MinValueValidator(1), MaxValueValidator(16)]
    )
    fair_share = models.BooleanField(
        default=True,
        help_text="within a priority, replicas serve the tenant (API key owner) that got the least service first;"
        " off: first come, first served",
    )
    engine = models.CharField(max_length=8, choices=Engine.choices, default=Engine.REAL)
    sim_profile = models.CharField(
        max_length=64, blank=True, default="", help_text="engine sim: a shipped profile's name (empty: cpu-demo)"
    )
    desired_state = models.CharField(max_length=8, choices=DesiredState.choices, default=DesiredState.RUNNING)
    generation = models.PositiveIntegerField(default=1, help_text="bumped by restart: older replicas are replaced")
    placement_error = models.TextField(blank=True, help_text="why replicas cannot be placed; empty when they can")
    max_surge = models.PositiveSmallIntegerField(
        default=1,
        validators=[MaxValueValidator(16)],
        help_text="replicas a restart or drain may start beyond `replicas` before old ones drain (0: replace in place)",
    )
    failed_at = models.DateTimeField(
        null=True, blank=True, help_text="when the reconciler gave up starting replicas; cleared by start or restart"
    )
    failed_reason = models.TextField(blank=True, help_text="why it gave up; empty while it has not")
    failure_budget_reset_at = models.DateTimeField(
        null=True, blank=True, help_text="failed replicas stopped before this no longer count against the budget"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    def desired_counts(self) -> dict[str, int]:
        if self.desired_state != self.DesiredState.RUNNING:
            return {}
        if self.mode == self.Mode.DISAGGREGATED:
            return {Replica.Role.PREFILL: self.prefill_replicas, Replica.Role.DECODE: self.decode_replicas}
        return {Replica.Role.COLOCATED: self.replicas}

    @property
    def status(self) -> str:
        """What an operator needs to know first: stopped, failed (gave up: restart it) or running."""
        if self.desired_state != self.DesiredState.RUNNING:
            return "stopped"
        return "failed" if self.failed_at is not None else "running"

    @property
    def devices_per_replica(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel


class Replica(models.Model):
    """One engine process. Its lifecycle is a small state machine (see services.TRANSITIONS)."""

    class Role(models.TextChoices):
        COLOCATED = "colocated"
        PREFILL = "prefill"
        DECODE = "decode"

    class State(models.TextChoices):
        PENDING = "pending"
        STARTING = "starting"
        READY = "ready"
        DRAINING = "draining"
        STOPPED = "stopped"
        FAILED = "failed"

    ACTIVE_STATES = (State.PENDING, State.STARTING, State.READY)
    LIVE_STATES = (State.PENDING, State.STARTING, State.READY, State.DRAINING)

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="replica_set")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.COLOCATED)
    generation = models.PositiveIntegerField(default=1)
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="replicas")
    devices = models.ManyToManyField(Device, blank=True, related_name="replicas")
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING, db_index=True)
    endpoint = models.JSONField(default=dict, blank=True, help_text="how to reach it: stream names, KV address")
    pid = models.PositiveIntegerField(null=True, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    restart_count = models.PositiveSmallIntegerField(default=0)
    last_error = models.TextField(blank=True)
    log_tail = models.TextField(blank=True)
    load = models.JSONField(default=dict, blank=True, help_text="latest load report from the replica")
    progress = models.JSONField(default=dict, blank=True, help_text="loading stage and fraction, while starting")
    drain_requested_at = models.DateTimeField(
        null=True, blank=True, help_text="an operator asked to drain it: it drains once its replacement is ready"
    )
    last_event_ns = models.BigIntegerField(
        default=0, help_text="when its agent sent the last message applied (older ones arrive late and are ignored)"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["deployment__slug", "id"]

    def __str__(self) -> str:
        return f"{self.deployment.slug}#{self.pk} ({self.role})"
