"""Every weight file format, kept away from the model code: the Comfy-Org all-in-one checkpoint (`checkpoint`),
ConvRot int8 (`quant`) and its load self-check (`selfcheck`), the embedded tokenizer (`tokenizer`), where a checkpoint
is found (`locate`), synthetic checkpoints for tests and benchmarks (`synthetic`, `synthetic_tokenizer`); LoRA
adapters (`lora/`), VAE decoder files (`vae_files`) and the vendor's split checkpoint (`vendor`)."""
