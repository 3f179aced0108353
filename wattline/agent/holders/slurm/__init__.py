"""A Slurm node's jobs, from the Prolog's notes to after the Epilog (docs/operations/slurm.md)."""
