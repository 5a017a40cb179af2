"""Hydra launcher plugin: submitit's Slurm launcher that checks every sweep member's config before submitting."""
