"""``python -m batchgen.bench``: ``batchgen bench`` (``bench/command.py``) without the installed entry
point, as ``scripts/gpu_check.sh`` runs it from a checkout."""

from batchgen.bench.command import bench_command

if __name__ == "__main__":
    bench_command(prog_name="python -m batchgen.bench")
