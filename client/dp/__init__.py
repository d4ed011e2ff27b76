"""Sample-level DP on a client: the step engine (Poisson sampling, per-example gradients, global clip,
noise), the LoRA optimizers (``optimizers``: prism, dp-adamw, ffa, sparta), PRISM's math (``prism``) and the
sample-level noise plan."""
