"""What runs a sweep's tasks, on this machine (`thicket run`) or in a pod (`thicket worker`).

- `sweep`: run a list of tasks: serve the policy, open the envs, run the worker, summarise;
- `worker`: the loop that grows many trees at once and commits each finished one;
- `served_policy`: the spec's policy section as a running Policy (starting a local vLLM if asked);
- `envs`: where a run's envs come from (in process, a `thicket serve-env` child, a running server).
"""
