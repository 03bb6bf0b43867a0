"""The spec's `cluster` section: how a sweep runs as Kubernetes Indexed Jobs, as validated data.

Part of the core: thicket.spec's SweepSpec holds it, so it imports nothing of thicket.k8s (which
renders it into objects and drives the cluster).

- `cluster`: ClusterSpec, the section itself (with its images and probes);
- `resources`, `ephemeral_storage`, `container_env`: each container's requests and limits, its
  local disk, its extra environment variables;
- `placement`: node selectors, tolerations and the Kueue queue; `aggregate`: the aggregation Jobs;
- `sidecars`: the env sidecars; `model_cache`: where the pods' vLLM finds its model;
- `values`: Kubernetes value formats (names, labels, quantities, images), checked as the API
  server checks them; `base`: the models' base class.
"""
