"""Everything Kubernetes: a sweep as Indexed Jobs, and the commands that drive them.

The spec's `cluster` section is not here: it is part of the core (thicket.cluster_spec), which never
imports thicket.k8s (`spec` only re-exports it under its old path).

- `names`, `containers`, `render`: spec -> objects (plain dicts), in apply order;
- `rules`: what the API server would refuse, checked offline;
- `node_fit` (with the `machine_types` table): whether the pod fits the GPU nodes it asks for
  (`pod_packing`: small GPU pods sent to large GPU nodes);
- `client` (API access: kubeconfig or the pod's service account; `api_retry`: its retries),
  `preflight` (what submit checks first, `storage_class` and `queue_check` too), `submit` (create-or-update, cancel;
  `canary`: index 0 alone until its first committed shard; `kueue`: stopping and scaling a queued
  Job through its Workload; `resume_indexes`: `--resume` as a Job of the unfinished indexes), `fault_price` (the GPU-hours each fault class may burn), `status` (per-index state, logs; `status_view` prints it;
  `workload_status`: a queued Job's Kueue Workload conditions),
  `job_wait` (a Job's state, wait-job);
- `commands`: the `thicket` subcommands for all of the above;
- `rehearsal`: the rendered pods, run on this machine with podman (`thicket rehearse`).
"""
