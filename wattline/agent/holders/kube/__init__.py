"""Kubernetes pods as wattline jobs: the agent's pod watcher and what it reads (docs/operations/kubernetes.md).

- :mod:`.settings`: the ``[kubernetes]`` settings (the agent loads the rest only where pods are on).
- :mod:`.pods`: a pod list (kubelet ``/pods`` or the API server's list) parsed; which pods are
  jobs, their job id, name, labels, and how a pod ended.
- :mod:`.podlist`: fetching that list over HTTP(S).
- :mod:`.cgroups`: each pod's cgroup (v1/v2, cgroupfs/systemd drivers), its CPU time, and
  which pod a process belongs to.
- :mod:`.podresources`: the devices the kubelet gave each pod (pod-resources API v1, gRPC).
- :mod:`.pod_units`: a service pod's units, scraped from its own Prometheus endpoint.
- :mod:`.pod_events`: a pod's own events file, read without following what the pod named.
- :mod:`.event_places`: where each of a pod job's events sits in its event_seq block.
- :mod:`.watcher`: the loop that turns all this into job events in the host outbox.
"""
