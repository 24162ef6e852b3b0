"""Everything that imports verl or Ray's workers: AglPPOTrainer (verl's RayPPOTrainer with the ledger's rollout
phase), its task runner, the CPU platform plug-in, rollout correction, the `agl_file` checkpoint backend and the LoRA
worker. The driver (runner.py, ray_env.py, config.py) never imports this folder at module level: ~15 s less to the
first step (bench/trainer_launch_bench.py)."""
