"""A simulated engine: the replica protocol, the scheduler, the paged KV cache with prefix
caching and preemption of the real engine, with time taken from a profile instead of a model.
A hundred of them run on a laptop (no torch), so the control plane and the autoscaler can be
measured at fleet size (docs/operations.md, "The simulated engine")."""
