"""Training with the HF Trainer: the base model located, hashed and adapted (LoRA or full), the Trainer and
rentune's callbacks (checkpoint commits, SIGTERM, deadline, divergence, first-steps checks), torchrun and
DeepSpeed launch, the device decision, peak memory and OOM, the parameter check, and the versions of
everything (environment). No phase logic: phases/train.py and phases/probe.py are the recipes.
"""
