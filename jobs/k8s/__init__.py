"""Everything Kubernetes: a sweep as Indexed Jobs, and the commands that drive them.

- `spec`: the spec's `cluster` section (validated names, images, resources, probes);
- `names`, `containers`, `render`: spec -> objects (plain dicts), in apply order;
- `rules`: what the API server would refuse, checked offline;
- `client` (API access: kubeconfig or the pod's service account), `submit` (create-or-update,
  cancel), `status` (per-index state, logs, wait-job);
- `commands`: the `thicket` subcommands for all of the above;
- `rehearsal`: the rendered pods, run on this machine with podman (`thicket rehearse`).
"""
