"""Who holds each open job on this host (Slurm, Kubernetes pods, systemd units, wrappers),
so that a dead holder's job ends at once."""
